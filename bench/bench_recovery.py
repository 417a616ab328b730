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
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from day0.orchestration.recovery import settings  # noqa: E402
from day0.stack import core, procs  # noqa: E402
from tests.faults.conftest import Stack, upload  # noqa: E402 - the fault suite's stack client
from tests.receiver.support import wait_until  # noqa: E402


def crashed(stack: Stack, model: str, run_id: str) -> dict | None:
    return next((r for r in stack.runs(model) if r["id"] == run_id
                 and r["state"]["type"] == "CRASHED"), None)


def rerun_passed(stack: Stack, model: str) -> bool:
    runs = stack.runs(model)[1:]
    return bool(runs) and runs[0]["state"]["type"] == "COMPLETED"


def upload_and_catch(stack: Stack, model: str, fixture: str) -> dict:
    """Upload a fixture as model and wait until its run is in a stage. Each case uploads other
    weights: the same ones would reuse the cached stages, which end at once."""
    assert upload(stack, model, fixture=fixture).wait(timeout=300) == 0
    run = wait_until(lambda: stack.running_stage(model, ("alignment", "evaluation")), 300, 0.5)
    assert run, f"no run of {model} reached a stage"
    return run


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="day0-bench-recovery-"))
    env = {**os.environ, "DAY0_STACK_DIR": str(root / "state"), "DAY0_CACHE_DIR": str(root / "cache"),
           "DAY0_OUTBOX_DIR": str(root / "outbox")}
    for name in ("DAY0_RESULTS_URI", "PREFECT_API_URL"):
        env.pop(name, None)
    stack = Stack(core.Layout(root / "state"), env)
    up = stack.day0("stack", "up")
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    rows = []
    try:
        run = upload_and_catch(stack, "bench/worker", "tiny-llama")
        os.kill(stack.pid("serve"), signal.SIGKILL)
        began = time.monotonic()
        assert wait_until(lambda: crashed(stack, "bench/worker", run["id"]), 300, 0.5)
        rows.append(("worker killed: run Crashed after", time.monotonic() - began))
        print(f"{rows[-1][0]:<60} {rows[-1][1]:7.1f} s", flush=True)
        assert stack.day0("stack", "up").returncode == 0
        began = time.monotonic()
        assert wait_until(lambda: rerun_passed(stack, "bench/worker"), 600, 2)
        rows.append(("  `stack up` to the new run's PASS", time.monotonic() - began))
        print(f"{rows[-1][0]:<60} {rows[-1][1]:7.1f} s", flush=True)

        run = upload_and_catch(stack, "bench/machine", "tiny-qwen3moe")
        serve = stack.pid("serve")
        for pid in procs.tree(serve):  # the worker and its run at once: nobody says goodbye
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        began = time.monotonic()
        message = wait_until(lambda: crashed(stack, "bench/machine", run["id"]), 600, 2)
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
