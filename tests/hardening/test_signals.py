"""SIGTERM or Ctrl-C to `day0 validate`'s process group, as `timeout 60 day0 validate ...` and a
terminal send them (issue 27): the report of what finished is written, the rest marked
interrupted, the flow run ends Crashed (never left Running), the command exits 128 + the signal
within 30 s and leaves no process or temp folder. Was: the group signal killed the temporary
Prefect server too; day0 retried it for minutes and ended "internal error: ConnectError"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import MODELS

pytestmark = pytest.mark.integration
EXIT_WITHIN_S = 30


def _session_members(sid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:  # session id
                found.append(int(entry.name))
    return found


def _interrupt(tmp_path, env: dict, signum: int, log: Path) -> tuple[int, float]:
    """Validate tiny-llama, signal its process group once a stage runs; (exit code, seconds
    from the signal to the exit)."""
    proc = subprocess.Popen([sys.executable, "-m", "day0.cli", "validate", str(MODELS / "tiny-llama"),
                             "--no-cache", "--out", str(tmp_path / "out")],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while "Task run 'alignment'" not in log.read_text():  # mid-run: after analysis
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    os.killpg(proc.pid, signum)
    signalled = time.monotonic()
    try:
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - signalled
    # nothing of it left: its session (stage host, temporary server are in their own ones:
    # those are gone because the command stopped them) and no temp folder of its own
    time.sleep(0.5)
    assert _session_members(proc.pid) == []
    owner = f"-{proc.pid}-"
    assert not [p for p in Path(tempfile.gettempdir()).glob("day0-*") if owner in p.name]
    return code, took


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "DAY0_SERVER_DIR": str(tmp_path / "no-kept-server"),  # none to attach to
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **extra}


def _report_of_what_finished(tmp_path, signum: int) -> dict:
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "ERROR"  # an interrupted run never passes
    assert report["stages"]["analysis"]["ok"]
    unfinished = {n for n, s in report["stages"].items() if not s["ok"]}
    assert all(report["stages"][n]["failure"] == "interrupted" for n in unfinished), report["stages"]
    assert all(f"got signal {signum}" in report["stages"][n]["error"] for n in unfinished)
    return report


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_validation_on_its_temporary_server_keeps_its_report(tmp_path, signum):
    log = tmp_path / "validate.log"
    code, took = _interrupt(tmp_path, _env(tmp_path), signum, log)
    text = log.read_text()
    assert code == 128 + signum and took < EXIT_WITHIN_S, (code, took, text[-3000:])
    _report_of_what_finished(tmp_path, signum)
    assert "Finished in state Crashed" in text  # told to its (temporary) server before it stopped
    assert "ConnectError" not in text and "internal error" not in text


def test_a_signalled_validation_on_an_external_server_ends_its_run_crashed(tmp_path,
                                                                         prefect_server):
    from prefect.client.orchestration import get_client

    log = tmp_path / "validate.log"
    code, took = _interrupt(tmp_path, _env(tmp_path, PREFECT_API_URL=prefect_server),
                            signal.SIGTERM, log)
    assert code == 143 and took < EXIT_WITHIN_S, (code, took, log.read_text()[-3000:])
    report = _report_of_what_finished(tmp_path, signal.SIGTERM)
    prefix = report["identity"]["run_id"].rsplit("-", 1)[1]  # the flow run id's first 8 hex
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs(limit=200) if r.id.hex.startswith(prefix)]
    assert len(runs) == 1 and runs[0].state.type.value == "CRASHED", runs
