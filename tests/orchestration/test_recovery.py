"""A served run whose worker dies stops and ends Crashed (the worker watch); a run whose process
died ends Crashed by Prefect's zombie automation, created once per server and kept equal to the
file a process work pool is given (deploy/automations/zombie-runs.yaml)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from day0.orchestration import recovery

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from day0.orchestration import recovery
    marker = sys.argv[1]
    def on_term(signum, frame):
        with open(marker, "a") as fh:
            fh.write("SIGTERM\\n")
        os._exit(143)
    signal.signal(signal.SIGTERM, on_term)
    recovery.watch_worker(lambda parent: open(marker, "a").write(f"orphaned {parent}\\n"))
    print(os.getpid(), flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.1)
""")
# the worker: starts the run's process and waits on it, as `day0 serve` does
WORKER = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1], "
          "sys.argv[2]]); p.wait()")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def test_a_run_whose_worker_died_stops_itself(tmp_path):
    marker = tmp_path / "marker"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, CHILD, str(marker)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              start_new_session=True)
    try:
        child = int(worker.stdout.readline())
        time.sleep(2 * recovery.settings().parent_poll_s)  # a live worker: nothing happens
        assert not marker.exists() and not _gone(child)
        worker.kill()  # SIGKILL: the worker runs no clean-up
        worker.wait(timeout=10)
        deadline = time.monotonic() + 15
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(child), "the run outlived its worker"
        assert marker.read_text().splitlines() == [f"orphaned {worker.pid}", "SIGTERM"]
    finally:
        os.killpg(worker.pid, signal.SIGKILL) if worker.poll() is None else None


def test_the_deploy_file_is_the_automation_serve_creates():
    from prefect.events.schemas.automations import AutomationCore

    path = ROOT / "deploy" / "automations" / "zombie-runs.yaml"
    (data,) = yaml.safe_load(path.read_text())["automations"]
    made = recovery.zombie_automation()
    assert AutomationCore.model_validate(data) == AutomationCore.model_validate(
        made.model_dump(exclude={"id"}))
    s = recovery.settings()
    assert made.trigger.within.total_seconds() == s.zombie_after_s > s.heartbeat_s >= 30


def test_heartbeats_are_enabled_for_served_runs_unless_set(monkeypatch):
    monkeypatch.delenv(recovery.HEARTBEAT_ENV, raising=False)
    recovery.enable_heartbeats()
    assert os.environ[recovery.HEARTBEAT_ENV] == str(recovery.settings().heartbeat_s)
    monkeypatch.setenv(recovery.HEARTBEAT_ENV, "60")
    recovery.enable_heartbeats()
    assert os.environ[recovery.HEARTBEAT_ENV] == "60"


@pytest.mark.integration
def test_the_zombie_automation_is_created_once(prefect_server):
    from prefect.client.orchestration import get_client

    assert recovery.ensure_zombie_automation().endswith("created")
    assert recovery.ensure_zombie_automation().endswith("present")
    with get_client(sync_client=True) as client:
        found = client.read_automations_by_name(recovery.settings().automation_name)
    assert len(found) == 1 and found[0].actions[0].state.value == "CRASHED"
