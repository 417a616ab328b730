"""Issue 28, acceptance 2 and 3, against the real stack, in one release's life: the object store
(SeaweedFS) killed with SIGKILL as the last stage (performance) starts and brought back by `day0
stack up` 20 s later, while the stage waits to read its baseline; then killed again right after
that stage's process ends, before the flow publishes, and brought back 60 s later.

- Read outage: the stage asks the store again until it answers, and the verdict is the one a run
  without the outage gets (PASS on this fixture, the stage's "no baseline yet"), never ERROR.
- Publish outage: while the store is down the run's state is Failed "NOT PUBLISHED" with the
  verdict and why; within 2 minutes of the store's return, `day0 serve`'s outbox has published the
  report, its run folder and latest.json, and the run's state is its verdict's.

The hooks wait on the stack's processes, polled every 50 ms: the performance stage's process
(it names itself `day0:performance`) and its exit. The flow spends seconds building the report and
its plots before it publishes. Prefect's task-run states arrive too late for a hook.

Without the fix: the baseline read raises on the first refused connection (the stage's ERROR,
the verdict ERROR); the publish logs "results not published", the run ends Completed PASS and
nothing reaches the store after it returns."""

from __future__ import annotations

import os
import signal
import time

import pytest

from day0.stack import core, procs
from tests.faults.conftest import alive, upload, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def stage_process(stack, stage: str) -> int | None:
    """The process running stage for this stack: a stage names itself `day0:<stage>`
    (/proc/PID/comm, 15 bytes) and carries the stack's marker, whichever stage host forked it."""
    name = f"day0:{stage}"[:15]
    for pid in procs.marked({core.MARK: str(stack.layout.root)}):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == name and alive(pid):
                return pid
        except OSError:
            continue
    return None


def progress(stack, run_id: str, stage: str) -> str:
    """The description of the stage's progress artifact ('' before there is one)."""
    found = stack.api("POST", "/artifacts/filter", {"artifacts": {
        "flow_run_id": {"any_": [run_id]}, "key": {"any_": [f"day0-progress-{stage}"]}}})
    return " ".join(a.get("description") or "" for a in found)


def logs(stack, run_id: str) -> list[str]:
    return [log["message"] for log in stack.api("POST", "/logs/filter", {
        "logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200})]


def store_back(stack) -> None:
    up = stack.day0("stack", "up", timeout_s=300)  # starts what is missing, keeps what runs
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]


def test_a_store_outage_at_the_baseline_read_and_at_publish_loses_no_verdict(stack):
    model = "acme/fault-store"
    uploading = upload(stack, model, fixture="tiny-qwen3moe")
    assert uploading.wait(timeout=300) == 0, uploading.stdout.read()[-3000:]
    # Prefect's task-run states arrive a second or more late: the hook is the process itself
    stage = wait_for(lambda: stage_process(stack, "performance"), 600, 0.05)
    assert stage, [(r["name"], r["state"]["type"]) for r in stack.runs(model)]
    (run,) = [r for r in stack.runs(model) if r["state"]["type"] == "RUNNING"]
    others = {p.name: p.pid for p in stack.state.procs}

    # its weights are loaded and its measurements begin (its progress artifact says so, within
    # a second); the baseline is read after them
    assert wait_for(lambda: "measurements" in progress(stack, run["id"], "performance"), 300, 0.1)
    os.kill(stack.pid("seaweedfs"), signal.SIGKILL)  # 1. during the stage, before its read
    killed = time.monotonic()
    assert alive(stage), "the stage ended before the store was killed: no read to wait out"
    # the stage reaches its baseline read and asks the store again (its log says so)
    def asking() -> list[str]:
        return [line for line in logs(stack, run["id"])
                if "[performance] baseline" in line and "asking again" in line]

    wait_for(lambda: asking() or not alive(stage), 300, 1.0)
    assert wait_for(asking, 10, 1.0), [line for line in logs(stack, run["id"])
                                       if "performance" in line][-5:]
    time.sleep(max(0.0, 20 - (time.monotonic() - killed)))  # down 20 s in all
    assert alive(stage), "the stage waits for the store"
    store_back(stack)
    assert {p.name: p.pid for p in stack.state.procs}["serve"] == others["serve"]

    assert wait_for(lambda: not alive(stage), 120, 0.05), "the stage never ended"
    os.kill(stack.pid("seaweedfs"), signal.SIGKILL)  # 2. right after the last stage
    killed = time.monotonic()

    def state():
        return next(r for r in stack.runs(model) if r["id"] == run["id"])["state"]

    unpublished = wait_for(lambda: (s := state())["name"] == "NOT PUBLISHED" and s, 120, 1.0)
    assert unpublished, state()
    assert unpublished["type"] == "FAILED", unpublished
    assert unpublished["message"].startswith("PASS"), unpublished["message"]
    assert "store" in unpublished["message"] and "outbox" in unpublished["message"]
    revision = run["parameters"]["revision"]
    time.sleep(max(0.0, 60 - (time.monotonic() - killed)))
    store_back(stack)
    returned = time.monotonic()

    latest = wait_for(lambda: stack.latest(model, revision), 120, 1.0)
    assert latest, "nothing in the store 2 minutes after it returned"
    print(f"published {time.monotonic() - returned:.1f} s after the store returned")
    assert latest["uri"].rstrip("/").endswith(run["id"].replace("-", "")[:8]), latest
    report = stack.report(latest)
    assert report["verdict"] == "PASS", report.get("notes")
    # the read outage changed nothing: the stage asked again, then found no baseline yet
    perf = report["stages"]["performance"]
    assert perf["ok"], perf
    keys = {o["Key"] for o in stack.s3().list_objects_v2(
        Bucket="models", Prefix=latest["uri"].removeprefix("s3://models/"))["Contents"]}
    assert any(k.endswith("report.md") for k in keys) and len(keys) > 3, keys
    final = wait_for(lambda: (s := state())["type"] == "COMPLETED" and s, 60, 1.0)
    assert final and final["name"] == "PASS", state()
