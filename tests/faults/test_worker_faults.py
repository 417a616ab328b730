"""Issue 28, acceptance 1 and 5, against the real stack, in one release's life (one validation
less than two scenarios): `day0 stack upload --wait` of a checkpoint; its worker (`day0 serve`)
killed with SIGKILL during a stage; then the Prefect server killed too and left down for a
minute. The dead worker's run leaves no process and is Crashed within 2 minutes; the receiver
submits the release again; once `day0 stack up` brings Prefect and the worker back, the new run's
PASS is in the store within 5 minutes; the waiting upload said the server did not answer, waited,
followed the crashed run to the new one and exits 0, the verdict's code.

Without the fix: the flow-run process survives its worker (re-parented to PID 1) and runs its
stages on; the run stays Running until an unrelated validation marks it Crashed; the receiver
drops the release (no second run); `stack up` refuses a partly running stack; the waiting upload
ends with exit 4 on the first refused connection, or with exit 1 on the crashed run."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.faults.conftest import alive, descendants, upload, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_dead_worker_then_a_prefect_outage_still_end_in_a_published_pass(stack):
    model = "acme/fault-worker"
    waiting = upload(stack, model, wait=True)
    try:
        run = wait_for(lambda: stack.running_stage(model, ("alignment", "evaluation")), 300)
        assert run, stack.runs(model)
        serve, others = stack.pid("serve"), {p.name: p.pid for p in stack.state.procs}
        mine = descendants(serve)  # the flow-run process and its stages
        assert mine, "the worker runs the flow in a process of its own"
        os.kill(serve, signal.SIGKILL)
        killed = time.monotonic()

        crashed = wait_for(lambda: next((r for r in stack.runs(model) if r["id"] == run["id"]
                                         and r["state"]["type"] == "CRASHED"), None), 120)
        assert crashed, stack.runs(model)
        print(f"Crashed {time.monotonic() - killed:.1f} s after the worker's SIGKILL: "
              f"{crashed['state']['message']}")
        assert wait_for(lambda: not {p for p in mine if alive(p)}, 30), \
            f"processes of the dead worker's run left: {[p for p in mine if alive(p)]}"
        # the receiver submits the release again (it waits for a worker)
        assert wait_for(lambda: len(stack.runs(model)) == 2, 60), stack.runs(model)

        os.kill(stack.pid("prefect"), signal.SIGKILL)
        time.sleep(60)  # the outage itself: a minute without a Prefect server
        assert waiting.poll() is None, waiting.stdout.read()[-3000:]
        up = stack.day0("stack", "up", timeout_s=600)  # starts what is missing, keeps what runs
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        restarted = time.monotonic()
        now = {p.name: p.pid for p in stack.state.procs}
        assert now["receiver"] == others["receiver"] and now["seaweedfs"] == others["seaweedfs"]
        assert now["serve"] != serve and now["prefect"] != others["prefect"]

        revision = run["parameters"]["revision"]

        def rerun_verdict():
            again = [r for r in stack.runs(model)[1:] if r["state"]["type"] == "COMPLETED"]
            latest = stack.latest(model, revision)
            tail = again[0]["id"].replace("-", "")[:8] if again else None
            return latest if tail and latest and latest["uri"].rstrip("/").endswith(tail) else None

        latest = wait_for(rerun_verdict, 300, 2.0)
        assert latest, [(r["name"], r["state"]["type"]) for r in stack.runs(model)]
        print(f"verdict in the store {time.monotonic() - restarted:.1f} s after `stack up`")
        assert stack.report(latest)["verdict"] == "PASS"
        first, second = stack.runs(model)
        assert first["id"] == run["id"] and first["state"]["type"] == "CRASHED"
        out, _ = waiting.communicate(timeout=300)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, out[-3000:]
    assert "does not answer" in out and "answers again" in out, out[-3000:]
    assert "crashed (Execution was aborted by a termination signal.); following" in out
    assert f"/runs/flow-run/{second['id']}" in out, out[-3000:]
    assert "ended PASS: PASS" in out, out[-3000:]
