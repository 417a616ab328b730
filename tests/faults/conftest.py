"""One real stack per test module (`day0 stack up`: Prefect server, receiver, SeaweedFS, `day0
serve` as processes) and the hooks a fault test needs: wait for a stage of a release's run to
start (Prefect's task runs, not a sleep), the processes of a flow run, the verdict in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from day0.stack import core, procs
from tests.conftest import MODELS, ROOT
from tests.receiver.support import wait_until as wait_for  # noqa: F401 - the tests' wait
from tests.s3server import free_ports

FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


@dataclass
class Stack:
    layout: core.Layout
    env: dict

    @property
    def state(self) -> core.StackState:
        return self.layout.load()

    def day0(self, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "day0.cli", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout_s)

    def pid(self, part: str) -> int:
        return next(p.pid for p in self.state.procs if p.name == part)

    def api(self, method: str, path: str, body: dict | None = None):
        resp = httpx.request(method, self.state.api_url + path, json=body, timeout=30)
        resp.raise_for_status()
        return resp.json()

    def runs(self, model: str) -> list[dict]:
        """Flow runs of the deployment for s3://models/<model>, oldest first."""
        dep = self.api("GET", f"/deployments/name/{self.state.deployment}")
        found = self.api("POST", "/flow_runs/filter",
                         {"flow_runs": {"deployment_id": {"any_": [dep["id"]]}}})
        mine = [r for r in found if r["parameters"].get("source") == f"s3://models/{model}"]
        return sorted(mine, key=lambda r: r["created"])

    def running_stage(self, model: str, stages: tuple[str, ...]) -> dict | None:
        """The run of model whose task run of one of stages is Running, else None."""
        for run in self.runs(model):
            if run["state"]["type"] != "RUNNING":
                continue
            tasks = self.api("POST", "/task_runs/filter",
                             {"flow_runs": {"id": {"any_": [run["id"]]}}})
            if any(t["name"] in stages and (t.get("state") or {}).get("type") == "RUNNING"
                   for t in tasks):
                return run
        return None

    def s3(self):
        from day0.store.s3 import s3_client

        secrets = core.read_env_file(self.layout.secrets)
        return s3_client(endpoint=self.state.s3_url, access_key=secrets["DAY0_S3_ACCESS_KEY"],
                         secret_key=secrets["DAY0_S3_SECRET_KEY"], region=core.REGION)

    def latest(self, model: str, revision: str) -> dict | None:
        """latest.json of model's results on the stack's target, None while there is none."""
        key = f"day0-results/{model}/{revision}/{self.state.target}/latest.json"
        try:
            return json.loads(self.s3().get_object(Bucket=core.BUCKET, Key=key)["Body"].read())
        except Exception:  # noqa: BLE001 - not there yet, or the store is down
            return None

    def report(self, latest: dict) -> dict:
        key = latest["uri"].removeprefix(f"s3://{core.BUCKET}/") + "report.json"
        return json.loads(self.s3().get_object(Bucket=core.BUCKET, Key=key)["Body"].read())


def descendants(pid: int) -> set[int]:
    """The live processes below pid (a worker's flow-run processes and their stages)."""
    return {p for p in procs.tree(pid) - {pid} if alive(p)}


def alive(pid: int) -> bool:
    s = procs.stat(pid)
    return bool(s) and s[0] not in "ZX"


def upload(stack: Stack, model: str, *, wait: bool = False,
           fixture: str = "tiny-llama") -> subprocess.Popen:
    """`day0 stack upload` of a fixture checkpoint as model. Each test of a module validates
    weights of its own: the same weights again would reuse the stack's cached stages, which end
    before a hook could see them run."""
    args = [sys.executable, "-m", "day0.cli", "stack", "upload", str(MODELS / fixture), model]
    return subprocess.Popen(args + (["--wait"] if wait else []), cwd=ROOT, env=stack.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    layout = core.Layout(tmp_path_factory.mktemp("stack") / "state")
    ports = dict(zip(("PREFECT", "RECEIVER", "S3", "MASTER", "VOLUME", "FILER"), free_ports(6)))
    # a cache of its own: stages the session cached for these fixtures would end at once
    env = {**os.environ, "DAY0_STACK_DIR": str(layout.root),
           "DAY0_CACHE_DIR": str(layout.root.parent / "cache"),
           # what its serve drains, and its stage hosts: never the test session's
           "DAY0_OUTBOX_DIR": str(layout.root.parent / "outbox"),
           "DAY0_SERVER_DIR": str(layout.root.parent / "server")}
    env.update({f"DAY0_STACK_{name}_PORT": str(port) for name, port in ports.items()})
    env.pop("DAY0_RESULTS_URI", None)
    env.pop("PREFECT_API_URL", None)
    made = Stack(layout, env)
    up = made.day0("stack", "up", timeout_s=900)
    assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
    try:
        yield made
    finally:
        made.day0("stack", "down", timeout_s=300)
