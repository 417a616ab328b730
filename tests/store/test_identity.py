"""day0.store.identity: one model name, one revision, one results folder per checkpoint, runs kept.

The first half needs nothing but a temp folder; the second half runs against the session's
SeaweedFS (tests/s3server.py) and compares the receiver's naming with a manual run's."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
import uuid

import pytest

from day0.store import identity
from day0.errors import InputError
from day0.store.s3 import ObjectInfo
from tests.conftest import MODELS, ROOT

LLAMA = MODELS / "tiny-llama"
FILES = {"report.json": b'{"verdict": "PASS"}', "report.md": b"# PASS", "stages/analysis.json": b"{}"}


def run_id(second: int, tail: str = "0" * 8) -> str:
    return identity.new_run_id(tail, now=dt.datetime(2026, 11, 30, 20, 15, second,
                                                     tzinfo=dt.timezone.utc))


# --------------------------------------------------------------------------- names

@pytest.mark.parametrize("source,revision,model", [
    ("s3://models/acme/tiny-llama", None, "acme/tiny-llama"),  # never the bucket
    ("s3://models/acme/tiny-llama/", None, "acme/tiny-llama"),
    ("s3://models/acme/tiny-llama/config.json", None, "acme/tiny-llama"),
    ("s3://models", None, "models"),  # a bare bucket is its own name
    ("s3://hub-mirror/org/name/" + "c" * 40, "c" * 40, "org/name"),  # HF style: revision once
    ("s3://hub-mirror/org/name/v1.0", "v1.0", "org/name"),
    ("s3://hub-mirror/org/name/v1.0", None, "org/name/v1.0"),  # no revision given: kept
    ("s3://hub-mirror/org/name/v1.0", "v2.0", "org/name/v1.0"),
    ("s3://hub-mirror/v1.0", "v1.0", "v1.0"),  # never an empty model
])
def test_model_name_rules(source, revision, model):
    assert identity.model_name(source, revision) == model


def test_local_folder_and_file_name(tmp_path):
    assert identity.model_name(str(LLAMA)) == "tiny-llama"
    assert identity.model_name(str(LLAMA / "config.json")) == "tiny-llama"


def test_resolve_local_gives_one_short_revision(tmp_path):
    ident = identity.resolve(str(LLAMA))
    assert ident.model == "tiny-llama" and not ident.revision_given
    assert len(ident.revision) == identity.REVISION_HEX == 16
    assert ident.revision == ident.weights_digest[:16] == identity.default_revision(str(LLAMA))
    assert ident.weights_digest == identity.weights_digest(str(LLAMA)) == identity.weights_key(str(LLAMA))
    # a copy elsewhere is the same weights; a changed byte is a new revision
    copy = tmp_path / "elsewhere"
    shutil.copytree(LLAMA, copy)
    assert identity.resolve(str(copy)).revision == ident.revision
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    assert identity.resolve(str(copy)).revision != ident.revision
    # a given revision wins and says so; a given model wins, with empty segments dropped
    named = identity.resolve(str(LLAMA), model="/acme//tiny-llama/", revision="v1.0",
                             weights=ident.weights_digest)
    assert (named.model, named.revision, named.revision_given) == ("acme/tiny-llama", "v1.0", True)
    assert named.weights_digest == ident.weights_digest


def test_unreadable_source(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(InputError, match="no such file"):
        identity.resolve(missing)
    loose = identity.resolve(missing, strict=False)
    assert loose.revision == identity.UNREADABLE and loose.weights_digest is None
    assert identity.weights_key(missing) == missing


def test_listing_revision_ignores_other_weight_formats_next_to_safetensors():
    objs = {"config.json": ObjectInfo("p/config.json", 10, "e1"),
            "model.safetensors": ObjectInfo("p/model.safetensors", 99, "e2")}
    rev = identity.listing_revision(objs)
    assert len(rev) == 16
    assert identity.listing_revision({**objs, "pytorch_model.bin": ObjectInfo("p/b", 5, "e3")}) == rev
    assert identity.listing_revision({**objs, "tokenizer.json": ObjectInfo("p/t", 5, "e4")}) != rev
    changed = {**objs, "model.safetensors": ObjectInfo("p/model.safetensors", 99, "e9")}
    assert identity.listing_revision(changed) != rev


def test_dedupe_key():
    assert identity.dedupe_key("acme/m", "r1", "cpu-bf16") == "day0:acme/m@r1:cpu-bf16"
    assert identity.dedupe_key("acme/m", "r1", "cpu-bf16", seq=3) == "day0:acme/m@r1:cpu-bf16#3"
    ident = identity.Identity("acme/m", "r1", None, True)
    assert ident.dedupe_key("cpu-bf16") == "day0:acme/m@r1:cpu-bf16"


def test_run_ids_sort_by_time():
    a = identity.new_run_id("5c98820a-166d-4b1e-9d39-0da7f5a1c0de",
                            now=dt.datetime(2025, 11, 30, 20, 15, 2, tzinfo=dt.timezone.utc))
    assert a == "20251130T201502Z-5c98820a"
    b = identity.new_run_id(None)
    assert b > a and len(b) == len(a)
    assert run_id(1, "f" * 8) < run_id(2)


def test_dependencies_stay_torch_free():
    """The receiver imports day0.store.identity; nothing it imports may pull torch or the engine."""
    code = ("import sys, day0.store.identity, day0.receiver.app; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') "
            "or m in ('day0.execution.cache', 'day0.store.sources', 'day0.execution.stage', 'day0.checkpoint.modeling')); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- results (local)

def test_runs_are_kept_and_latest_names_the_newest(tmp_path, monkeypatch):
    monkeypatch.delenv("DAY0_RESULTS_URI", raising=False)
    base = str(tmp_path / "results")
    src = str(LLAMA)
    # a local source publishes only with a results URI
    assert identity.publish_run(FILES, source=src, target_name="cpu-bf16", run_id=run_id(1)) is None
    assert identity.read_latest(source=src, target_name="cpu-bf16") is None

    first = identity.publish_run(FILES, source=src, target_name="cpu-bf16", run_id=run_id(1),
                                 results_uri=base)
    rev = identity.resolve(src).revision
    folder = tmp_path / "results" / "tiny-llama" / rev / "cpu-bf16"
    assert first == str(folder / "runs" / run_id(1)) + "/"
    assert json.loads((folder / "runs" / run_id(1) / "report.json").read_bytes())["verdict"] == "PASS"
    assert (folder / "runs" / run_id(1) / "stages" / "analysis.json").is_file()
    newer = identity.publish_run(FILES, source=src, target_name="cpu-bf16", run_id=run_id(3),
                                 results_uri=base)
    # an older run that publishes late is kept, and does not take latest
    identity.publish_run(FILES, source=src, target_name="cpu-bf16", run_id=run_id(2),
                         results_uri=base)
    assert sorted(p.name for p in (folder / "runs").iterdir()) == [run_id(1), run_id(2), run_id(3)]
    latest = identity.read_latest(source=src, target_name="cpu-bf16", results_uri=base)
    assert latest["run_id"] == run_id(3) and latest["uri"] == newer and latest["created_at"]
    assert json.loads((folder / "latest.json").read_bytes()) == latest
    # a run is never overwritten
    with pytest.raises(InputError, match="already published"):
        identity.publish_run(FILES, source=src, target_name="cpu-bf16", run_id=run_id(3),
                             results_uri=base)
    with pytest.raises(InputError, match="run id"):
        identity.publish_run(FILES, source=src, target_name="cpu-bf16", run_id="../x",
                             results_uri=base)
    # DAY0_RESULTS_URI is the default base; a given model and revision name the folder, once
    monkeypatch.setenv("DAY0_RESULTS_URI", base)
    named = identity.publish_run(FILES, source=src, target_name="cpu-bf16", model="acme/tiny",
                                 revision="v1.0", run_id=run_id(4))
    assert named == str(tmp_path / "results" / "acme" / "tiny" / "v1.0" / "cpu-bf16" / "runs"
                        / run_id(4)) + "/"
    assert identity.read_latest(source=src, target_name="cpu-bf16", model="acme/tiny",
                                revision="v1.0")["uri"] == named


def test_damaged_latest_is_replaced(tmp_path):
    base = str(tmp_path)
    where = identity.results_location(base, str(LLAMA), "cpu-bf16", "r1")
    (tmp_path / "tiny-llama" / "r1" / "cpu-bf16").mkdir(parents=True)
    (tmp_path / "tiny-llama" / "r1" / "cpu-bf16" / "latest.json").write_text("{not json")
    uri = identity.publish_run(FILES, source=str(LLAMA), target_name="cpu-bf16", revision="r1",
                               run_id=run_id(5), results_uri=base)
    assert uri.startswith(where)
    assert identity.read_latest(source=str(LLAMA), target_name="cpu-bf16", revision="r1",
                                results_uri=base)["run_id"] == run_id(5)


def test_a_run_kept_without_taking_latest(tmp_path):
    base = str(tmp_path)
    full = identity.publish_run(FILES, source=str(LLAMA), target_name="cpu-bf16", revision="r1",
                                run_id=run_id(1), results_uri=base)
    later = identity.publish_run(FILES, source=str(LLAMA), target_name="cpu-bf16", revision="r1",
                                 run_id=run_id(2), results_uri=base, point_latest=False)
    assert (tmp_path / later.removeprefix(base + '/') / "report.json").is_file()
    latest = lambda: identity.read_latest(source=str(LLAMA), target_name="cpu-bf16",  # noqa: E731
                                          revision="r1", results_uri=base)["uri"]
    assert latest() == full


# --------------------------------------------------------------------------- s3 (SeaweedFS)

@pytest.fixture
def store(s3_server, monkeypatch):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DAY0_RESULTS_URI", raising=False)
    s3_server.create_bucket("models")
    return s3_server


@pytest.mark.integration
def test_receiver_and_manual_run_name_an_upload_alike(store, tmp_path):
    from day0.receiver.completeness import check_prefix, model_of
    from day0.receiver.settings import CheckpointSettings

    prefix = f"acme/{uuid.uuid4().hex[:8]}/tiny-llama"
    uri = store.upload_dir(LLAMA, "models", prefix)
    store.client().put_object(Bucket="models", Key=f"{prefix}/pytorch_model.bin", Body=b"old format")
    manual = identity.resolve(uri)
    checked = check_prefix(store.client(), "models", prefix, CheckpointSettings())
    assert checked.complete
    assert (model_of("models", prefix), checked.revision) == (manual.model, manual.revision)
    assert manual.model == prefix and len(manual.revision) == 16
    assert manual.weights_digest == identity.weights_key(uri)
    # any new file under the prefix is a new revision for both
    store.client().put_object(Bucket="models", Key=f"{prefix}/README.md", Body=b"# tiny")
    again = check_prefix(store.client(), "models", prefix, CheckpointSettings())
    assert again.revision == identity.resolve(uri).revision != manual.revision


@pytest.mark.integration
def test_publish_runs_to_the_store(store):
    prefix = f"acme/{uuid.uuid4().hex[:8]}/tiny-llama"
    uri = store.upload_dir(LLAMA, "models", prefix)
    rev = identity.resolve(uri).revision
    uris = [identity.publish_run(FILES, source=uri, target_name="cpu-bf16", run_id=run_id(s))
            for s in (7, 9, 8)]
    folder = f"day0-results/{prefix}/{rev}/cpu-bf16/"
    assert uris[0] == f"s3://models/{folder}runs/{run_id(7)}/"
    client = store.client()
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket="models", Prefix=folder)["Contents"])
    assert keys == [f"{folder}latest.json"] + [f"{folder}runs/{run_id(s)}/{name}"
                                               for s in (7, 8, 9) for name in sorted(FILES)]
    got = client.get_object(Bucket="models", Key=f"{folder}runs/{run_id(9)}/report.md")
    assert got["ContentType"].startswith("text/markdown")
    latest = identity.read_latest(source=uri, target_name="cpu-bf16")
    assert latest["run_id"] == run_id(9) and latest["uri"] == uris[1]
    with pytest.raises(InputError, match="already published"):
        identity.publish_run(FILES, source=uri, target_name="cpu-bf16", run_id=run_id(9))
    # HF style: the source ends with the revision, which names the folder once
    sha = "c" * 40
    hf = store.upload_dir(LLAMA, "models", f"hub/{prefix}/{sha}")
    where = identity.publish_run(FILES, source=hf, target_name="cpu-bf16", revision=sha,
                                 run_id=run_id(10))
    assert where == f"s3://models/day0-results/hub/{prefix}/{sha}/cpu-bf16/runs/{run_id(10)}/"
    # another base: DAY0_RESULTS_URI
    store.create_bucket("reports")
    other = identity.publish_run(FILES, source=uri, target_name="cpu-bf16", run_id=run_id(11),
                                 results_uri="s3://reports/nightly")
    assert other == f"s3://reports/nightly/{prefix}/{rev}/cpu-bf16/runs/{run_id(11)}/"
