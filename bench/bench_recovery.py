"""How long a release waits when a part of the stack dies, measured on a real stack (`day0 stack
up` in a temporary folder, tiny-llama uploaded as a release), side by side:

  * worker killed (tiny-llama) - SIGKILL of `day0 serve` during a stage: seconds until the run is Crashed (the
    run stops itself: day0.orchestration.recovery.watch_worker), then, after `day0 stack up`,
    seconds until the release's new run has its verdict in the store;
  * machine died (tiny-qwen3moe) - SIGKILL of `day0 serve` and every process of its run at once: seconds until
    Prefect's zombie automation sets the run Crashed (no heartbeat for zombie_after_s).

Run: .venv/bin/python bench/bench_recovery.py   (about 5 minutes on the 2-core machine)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from day0.orchestration.recovery import settings  # noqa: E402
from day0.stack import core, procs  # noqa: E402

MODELS = ROOT / "tests" / "fixtures" / "models"


def wait(predicate, timeout_s: float, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(every_s)
    return None


class Stack:
    def __init__(self, root: Path):
        self.layout = core.Layout(root / "state")
        self.env = {**os.environ, "DAY0_STACK_DIR": str(self.layout.root),
                    "DAY0_CACHE_DIR": str(root / "cache"), "DAY0_OUTBOX_DIR": str(root / "outbox")}
        for name in ("DAY0_RESULTS_URI", "PREFECT_API_URL"):
            self.env.pop(name, None)

    def day0(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "day0.cli", *args], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=900)

    def pid(self, part: str) -> int:
        return next(p.pid for p in self.layout.load().procs if p.name == part)

    def api(self, path: str, body: dict | None = None):
        url = self.layout.load().api_url + path
        return httpx.request("POST" if body is not None else "GET", url, json=body, timeout=30).json()

    def runs(self, model: str) -> list[dict]:
        dep = self.api(f"/deployments/name/{self.layout.load().deployment}")
        found = self.api("/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [dep["id"]]}}})
        return sorted((r for r in found if r["parameters"].get("source") == f"s3://models/{model}"),
                      key=lambda r: r["created"])

    def in_stage(self, model: str) -> dict | None:
        for run in self.runs(model):
            tasks = self.api("/task_runs/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}})
            if any(t["name"] in ("alignment", "evaluation")
                   and (t.get("state") or {}).get("type") == "RUNNING" for t in tasks):
                return run
        return None

    def crashed(self, model: str, run_id: str) -> dict | None:
        return next((r for r in self.runs(model) if r["id"] == run_id
                     and r["state"]["type"] == "CRASHED"), None)

    def rerun_passed(self, model: str) -> bool:
        runs = self.runs(model)[1:]
        return bool(runs) and runs[0]["state"]["type"] == "COMPLETED"

    def upload_and_catch(self, model: str, fixture: str) -> dict:
        """Upload a fixture as model and wait until its run is in a stage. Each case uploads
        other weights: the same ones would reuse the cached stages, which end at once."""
        done = self.day0("stack", "upload", str(MODELS / fixture), model)
        assert done.returncode == 0, done.stdout + done.stderr
        run = wait(lambda: self.in_stage(model), 300)
        assert run, f"no run of {model} reached a stage"
        return run


def main() -> int:
    stack = Stack(Path(tempfile.mkdtemp(prefix="day0-bench-recovery-")))
    up = stack.day0("stack", "up")
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    rows = []
    try:
        run = stack.upload_and_catch("bench/worker", "tiny-llama")
        os.kill(stack.pid("serve"), signal.SIGKILL)
        began = time.monotonic()
        assert wait(lambda: stack.crashed("bench/worker", run["id"]), 300)
        rows.append(("worker killed: run Crashed after", time.monotonic() - began))
        print(f"{rows[-1][0]:<60} {rows[-1][1]:7.1f} s", flush=True)
        assert stack.day0("stack", "up").returncode == 0
        began = time.monotonic()
        assert wait(lambda: stack.rerun_passed("bench/worker"), 600, 2)
        rows.append(("  `stack up` to the new run's PASS", time.monotonic() - began))
        print(f"{rows[-1][0]:<60} {rows[-1][1]:7.1f} s", flush=True)

        run = stack.upload_and_catch("bench/machine", "tiny-qwen3moe")
        serve = stack.pid("serve")
        for pid in procs.tree(serve):  # the worker and its run at once: nobody says goodbye
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        began = time.monotonic()
        message = wait(lambda: stack.crashed("bench/machine", run["id"]), 600, 2)
        rows.append(("machine died: run Crashed after", time.monotonic() - began))
        rows.append((f"  (zombie_after_s {settings().zombie_after_s}, heartbeat_s "
                     f"{settings().heartbeat_s}): {message['state']['message'][:60]}", None))
    finally:
        stack.day0("stack", "down")
    print("side by side:")
    for what, seconds in rows:
        print(f"{what:<60} {'' if seconds is None else f'{seconds:7.1f} s'}")
    print(json.dumps({what.strip(): round(s, 1) for what, s in rows if s is not None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
