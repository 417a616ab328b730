"""Hostile checkpoints refused at the door (issue 27): exit 2 with one line naming the file and
the fix, before any server or stage starts, and never a byte of the file they point at."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from day0.errors import InputError
from day0.store import identity, links

MODELS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "models"
OUTSIDE = "/etc/passwd"  # a file every Linux machine has, whose content must never show


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    folder = tmp_path / "tiny-llama"
    shutil.copytree(MODELS / "tiny-llama", folder)
    return folder


def _cli(*argv: str) -> tuple[int, str, str]:
    """`day0 ARGV` as a user runs it; (exit code, stdout, stderr). How long each refusal takes
    and how much memory (the issue's 10 s and 1 GiB) is bench/bench_hostile_inputs.py's to
    measure; here a run that does not end within a minute is a hang and fails."""
    proc = subprocess.run([sys.executable, "-m", "day0.cli", *argv], capture_output=True,
                          text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"})
    return proc.returncode, proc.stdout, proc.stderr


def _refused(*argv) -> str:
    """Exit 2 with one line naming the file and the fix; never a traceback or file content."""
    code, _, err = _cli(*argv)
    assert code == 2, err[-2000:]
    err = err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "root:" not in err  # the linked file's content
    return err


@pytest.mark.parametrize("name", ["heldout.txt", "model-00002-of-00004.safetensors"])
def test_a_link_out_of_the_checkpoint_is_refused_before_anything_runs(checkpoint, name,
                                                                       tmp_path):
    (checkpoint / name).unlink(missing_ok=True)
    (checkpoint / name).symlink_to(OUTSIDE)
    for argv in (["analyze", str(checkpoint)],
                 ["validate", str(checkpoint), "--stages", "alignment", "--out",
                  str(tmp_path / "out")]):
        err = _refused(*argv)
        assert f"{name} is a symlink to a file outside the checkpoint folder" in err
        assert "copy the file into the checkpoint folder" in err
    assert not (tmp_path / "out").exists()
    # a run started another way (a deployment) stops at the weights digest, before any stage
    with pytest.raises(InputError, match="outside the checkpoint folder"):
        identity.weights_key(str(checkpoint))


def test_links_inside_the_folder_and_a_blob_cache_snapshot_are_followed(tmp_path):
    """Links that stay in the checkpoint, and Hugging Face's or day0's own blob cache layout
    (snapshots/<rev>/<file> -> ../../blobs/<id>), are not hostile."""
    inside = tmp_path / "model"
    inside.mkdir()
    (inside / "real.txt").write_text("text")
    (inside / "heldout.txt").symlink_to("real.txt")
    assert links.escaping(inside) == []
    repo = tmp_path / "models--acme--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text("{}")
    snapshot = repo / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/abc")
    assert links.escaping(snapshot) == []
    (snapshot / "heldout.txt").symlink_to(OUTSIDE)
    assert links.escaping(snapshot) == ["heldout.txt"]


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:  # a sparse file: 1 GB long, nothing on disk
        handle.truncate(size)
    return path


def test_an_evaluation_text_too_large_to_read_is_refused_at_the_door(checkpoint, tmp_path):
    """Was: a 1 GB sparse heldout.txt grew the stage to 3.18 GB until its budget killed it
    (ERROR, and the advice to raise memory_limit_gib)."""
    _sparse(checkpoint / "heldout.txt", 1 << 30)
    err = _refused("validate", str(checkpoint), "--stages", "alignment")
    assert "heldout.txt" in err and "over the 16777216 bytes" in err
    (checkpoint / "heldout.txt").unlink()
    big = _sparse(tmp_path / "big.txt", 1 << 30)
    err = _refused("validate", str(checkpoint), "--stages", "alignment", "--text", str(big))
    assert "big.txt" in err and "alignment.text_file" in err
    # a stage started another way reads nothing of it either
    from day0.errors import Day0Error
    from day0.torchkit.evaltext import read_text

    with pytest.raises(Day0Error, match="over the 16777216 bytes"):
        read_text(big)


HUNG_RE = r"([\s\S]+)+QQQQQ"  # passed re.compile, then hung re.search on a 32-token answer
CATASTROPHIC = r"^(a|a)*$"  # backtracks even in the `regex` module's engine


def test_a_catastrophic_business_regex_is_a_config_error_naming_its_row(tmp_path,
                                                                         checkpoint):
    import json

    from day0.errors import ConfigError
    from day0.stages.evaluation import business

    # the pattern: the `regex` module's engine answers within the match's time limit
    # (past it, process_results raises: see below)
    doc = {"id": "q", "line": 1, "match": "regex", "answer": HUNG_RE}
    assert business.process_results(doc, ["word " * 32]) == {"acc": 0.0}
    rows = tmp_path / "business.jsonl"
    rows.write_text(json.dumps({"id": "ok", "prompt": "2+2?", "answer": r"\b4\b", "match": "regex"})
                    + "\n" + json.dumps({"id": "evil", "prompt": "Say a", "answer": CATASTROPHIC,
                                         "match": "regex"}) + "\n")
    with pytest.raises(InputError) as refused:
        business.read_rows(rows)
    assert "line 2" in str(refused.value) and "backtracks catastrophically" in str(refused.value)
    config = tmp_path / "settings.yaml"
    config.write_text(f"evaluation: {{business_file: '{rows}'}}\n")
    err = _refused("validate", str(checkpoint), "--stages", "evaluation",
                   "--config", str(config))
    assert "line 2" in err and "backtracks catastrophically" in err
    # a pattern the probes miss still runs with a time limit: its row is named, not a hang
    doc = {"id": "evil", "line": 2, "match": "regex", "answer": CATASTROPHIC}
    with pytest.raises(ConfigError, match="row evil: its answer regex ran out of"):
        business.process_results(doc, ["a" * 200 + "!"])
    assert business.process_results({"match": "regex", "answer": r"\b4\b"}, ["it is 4"]) == {"acc": 1.0}


SPINS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
GROWS = ("{% set ns = namespace(kept=[]) %}{% for i in range(99999) %}"
         "{% set ns.kept = ns.kept + [('x' * 10000000) ~ i] %}{% endfor %}{{ ns.kept|length }}")
FLOODS = "{% for i in range(99999) %}{{ 'x' * 1000 }}{% endfor %}"


@pytest.mark.parametrize("template,why", [
    (SPINS, "did not finish rendering"), (GROWS, "of memory"), (FLOODS, "characters")],
    ids=["spins", "grows", "floods"])
def test_a_chat_template_that_cannot_be_served_is_a_checkpoint_finding(checkpoint,
                                                                       template, why):
    """Was: nested range(99999) loops passed the sandbox, then spun the CPU until the stage's
    900 s limit, or grew 80 MB/s to 3.15 GB until its budget killed it (ERROR, 'raise
    memory_limit_gib'). Now: BROKEN (exit 5) at analysis, in seconds, naming the template."""
    import json

    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    code, out, _ = _cli("analyze", str(checkpoint))
    assert code == 5
    line = next(x for x in out.splitlines() if "chat template" in x)
    assert "tokenizer_config.json chat_template" in line and why in line
    assert "range(" not in out  # the template's text is never echoed


def test_a_real_chat_template_renders_within_the_limits():
    from day0.checkpoint import chat_template
    from day0.checkpoint.files import open_reader

    found = chat_template.templates(open_reader(MODELS / "tiny-llama"))
    assert found and chat_template.problems(open_reader(MODELS / "tiny-llama")) == []


def test_the_weights_digest_reads_only_what_a_loader_reads(checkpoint, monkeypatch):
    """Was: a 32 GiB sparse notes.md added 45 s of silent hashing before any stage (a 1 TiB file
    about 20 minutes). What a loader reads is hashed; any other file is listed by name and size
    (bench/bench_digest.py times it)."""
    before = identity.local_weights_digest(checkpoint)
    _sparse(checkpoint / "notes.md", 32 << 30)
    hashed = []
    real = identity.file_digest
    monkeypatch.setattr(identity, "file_digest", lambda f: hashed.append(f.name) or real(f))
    with_notes = identity.local_weights_digest(checkpoint)
    assert hashed and "notes.md" not in hashed  # never read
    monkeypatch.undo()
    assert with_notes != before  # listed: a new file is a new checkpoint
    with open(checkpoint / "notes.md", "r+b") as handle:  # the same size, other bytes
        handle.write(b"edited")
    assert identity.local_weights_digest(checkpoint) == with_notes  # nothing reads it
    read = identity.loader_files(checkpoint)
    assert {"config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors.index.json", "heldout.txt" if (checkpoint / "heldout.txt").exists()
            else "config.json"} <= read
    assert {p.name for p in checkpoint.glob("*.safetensors")} <= read and "notes.md" not in read
    shard = next(checkpoint.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # one bit of a weight the index names
    shard.write_bytes(bytes(data))
    assert identity.local_weights_digest(checkpoint) != with_notes


def test_a_tokenizer_json_with_ids_past_the_vocabulary_is_broken_at_analysis(checkpoint):
    """Was: a tokenizer with 300k added tokens whose ids exceed vocab_size still PASSed."""
    import json

    doc = json.loads((checkpoint / "tokenizer.json").read_text())
    doc["added_tokens"] += [{"id": 512 + i, "content": f"<extra_{i}>", "single_word": False,
                             "lstrip": False, "rstrip": False, "normalized": False,
                             "special": False} for i in range(300_000)]
    (checkpoint / "tokenizer.json").write_text(json.dumps(doc))
    code, out, _ = _cli("analyze", str(checkpoint))
    assert code == 5
    assert ("tokenizer.json has 300000 token id(s) at or past config.json's vocab_size 512 "
            "(ids 512-300511)") in out


def test_alignment_checks_the_loaded_tokenizer_too(checkpoint):
    """A checkpoint whose tokenizer is not a tokenizer.json (sentencepiece, tiktoken) is held
    to the same rule where the tokenizer is loaded."""
    from transformers import AutoTokenizer

    from day0.execution.contract import StageInputs
    from day0.execution.targets import resolve_target
    from day0.stages.alignment.core import Config, run

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(3000)])
    tokenizer.save_pretrained(str(checkpoint))
    result = run(Config(max_windows=1, seq_len=64, generation_prompts=1, new_tokens=4,
                        op_tokens=8, reference_bank="off"),
                 StageInputs(source=str(checkpoint), target=resolve_target("cpu-bf16")))
    [problem] = [p for p in result.checkpoint_problems if "tokenizer" in p]
    assert "3000 token id(s) at or past the model's vocab_size 512 (ids 512-3511)" in problem
