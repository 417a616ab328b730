"""`day0 server`: one kept Prefect server that later `day0 validate` commands attach to (no
temporary server each), that stops by itself once idle, and that never overrides
PREFECT_API_URL. Real `prefect server start` processes on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from day0.stack import procs
from tests.conftest import MODELS

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def day0(*args, env, timeout=600):
    # output to files, not pipes: a process left behind holding a pipe would hang the test
    # instead of failing it on the leftover
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.run([sys.executable, "-m", "day0.cli", *map(str, args)], env=env,
                              stdout=out, stderr=err, text=True, timeout=timeout)
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def flow_runs(api_url: str) -> int:
    req = urllib.request.Request(api_url + "/flow_runs/count", data=b"{}",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(json.loads(resp.read()))


@pytest.fixture
def server_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(DAY0_SERVER_DIR=str(tmp_path / "server"), DAY0_CACHE_DIR=str(tmp_path / "cache"))
    yield env
    day0("server", "stop", env=env, timeout=60)


def orphaned_temporary_servers() -> set[int]:
    """Prefect temporary servers (uvicorn create_app) whose owner is gone (reparented to 1)."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        info = procs.stat(int(proc.name)) if proc.name.isdigit() else None
        if info and info[1] == 1 and b"prefect.server.api.server:create_app" in cmdline:
            found.add(int(proc.name))
    return found


def state(env) -> dict:
    return json.loads((Path(env["DAY0_SERVER_DIR"]) / "server.json").read_text())


def test_validations_attach_to_the_kept_server_and_stop_ends_it(server_env, tmp_path,
                                                                 prefect_server):
    started = day0("server", "start", "--port", procs.pick_port([None], set()), env=server_env)
    assert started.returncode == 0, started.stderr[-2000:]
    api_url, port = state(server_env)["api_url"], state(server_env)["port"]
    again = day0("server", "start", env=server_env)
    assert again.returncode == 0 and "already running" in again.stdout
    assert state(server_env)["api_url"] == api_url  # one server, not two

    # a kept stage host beside it, registered for this environment: validations fork from it
    hosts = Path(server_env["DAY0_SERVER_DIR"]) / "hosts"
    deadline = time.monotonic() + 120
    while not list(hosts.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    [record] = hosts.glob("*.json")
    host = json.loads(record.read_text())

    orphans = orphaned_temporary_servers()
    for n, stages in ((1, "analysis"), (2, "analysis,scan,alignment")):
        proc = day0("validate", MODELS / "tiny-llama", "--stages", stages, "--out",
                    tmp_path / f"run{n}", env=server_env)
        # a partial run, judged on what ran (its gates hold: exit 0)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert f"verdict: PASS (partial: stages {stages.replace(',', ', ')})" in proc.stdout
        assert (tmp_path / f"run{n}" / "report.json").is_file()
        assert f"on the kept Prefect server {api_url.removesuffix('/api')}" in proc.stderr
        assert flow_runs(api_url) == n  # its run is in the kept server's history
        # and no temporary server of its own (Prefect's threads read the process-wide settings)
        assert orphaned_temporary_servers() <= orphans
        forked = [line for line in proc.stderr.splitlines() if "forked from the kept" in line]
        assert forked and all(f"kept stage host (pid {host['pid']}," in line
                              for line in forked), proc.stderr[-3000:]

    # PREFECT_API_URL wins: a user's chosen server is never replaced
    elsewhere = day0("validate", MODELS / "tiny-llama", "--stages", "analysis", "--out",
                     tmp_path / "elsewhere", env={**server_env, "PREFECT_API_URL": prefect_server})
    assert elsewhere.returncode == 0, elsewhere.stderr[-2000:]
    assert "kept Prefect server" not in elsewhere.stderr
    assert flow_runs(api_url) == 2

    assert day0("server", "status", env=server_env).returncode == 0
    stopped = day0("server", "stop", env=server_env)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not procs.port_open(port)
    assert day0("server", "status", env=server_env).returncode == 1
    deadline = time.monotonic() + 30  # the host checks its anchor (the watcher) every second
    while procs.alive(host["pid"], host["ticks"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not procs.alive(host["pid"], host["ticks"]) and not record.exists()


def test_an_idle_server_stops_by_itself(server_env):
    started = day0("server", "start", "--idle-minutes", "0.1", env=server_env)
    assert started.returncode == 0, started.stderr[-2000:]
    s = state(server_env)
    deadline = time.monotonic() + 90  # idle 6 s, checked every 5 s
    while procs.alive(s["watcher"]["pid"], s["watcher"]["ticks"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not procs.alive(s["watcher"]["pid"], s["watcher"]["ticks"])
    assert not procs.alive(s["server"]["pid"], s["server"]["ticks"])
    assert not procs.port_open(s["port"])
    assert day0("server", "status", env=server_env).returncode == 1


def test_a_taken_port_is_refused_in_one_line(server_env):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = day0("server", "start", "--port", taken.getsockname()[1], env=server_env)
    assert proc.returncode == 2, proc.stderr
    assert "is taken" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
