"""A killed `day0 validate` leaves no stage process, no scratch folder and (after the next start)
no RUNNING flow run; scratch folders of dead owners are swept, live ones never."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from day0.execution import lifecycle
from tests import breakers
from tests.conftest import MODELS

# applied in the scan probe or alignment (whichever runs first): starts a grandchild in the
# stage's process group, says who they are, then hangs like a stuck kernel
SLEEPER = '''
import os, subprocess, time
from pathlib import Path


def apply(model):
    child = subprocess.Popen(["sleep", "600"])
    Path({marks!r}, str(os.getpid())).write_text(f"{{os.getpid()}} {{child.pid}}")
    time.sleep(600)
'''


def dead_token() -> str:
    """The owner token of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    token = lifecycle.owner_token(proc.pid)
    proc.wait()
    return token


def test_sweep_removes_only_dead_owners_folders(tmp_path):
    dead, mine = dead_token(), lifecycle.owner_token()
    assert not lifecycle.alive(dead) and lifecycle.alive(mine)
    orphan = tmp_path / f"day0-alignment-{dead}-abc123de"
    live = tmp_path / f"day0-scan-{mine}-abc123de"
    other = tmp_path / "day0-scan-k2j4h5g6"  # e.g. the docker runner's workdirs: not ours to judge
    for folder in (orphan, live, other):
        (folder / "sub").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    os.symlink(victim, tmp_path / f"day0-analysis-{dead}-zzzzzzzz")  # a link is never followed
    assert lifecycle.sweep_scratch(tmp_path) == [orphan]
    assert live.is_dir() and other.is_dir() and (victim / "keep").is_file()


def test_scratch_is_private_and_owner_named(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    folder = lifecycle.make_scratch("alignment")
    assert folder.parent == tmp_path and folder.stat().st_mode & 0o777 == 0o700
    assert lifecycle.SCRATCH_RE.match(folder.name)
    assert folder.name.startswith(f"day0-alignment-{lifecycle.owner_token()}-")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group pgid."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] not in "ZXx":
                found.append(int(entry.name))
    return found


def wait_for(predicate, timeout_s: float, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval_s)
    return predicate()


def runs_of(token: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    from tasks.housekeeping import OWNER_TAG

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[OWNER_TAG + token])))


def orphaned_running_runs():
    """RUNNING validate runs of this host whose owner is dead: none may survive a start."""
    import socket

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowFilter, FlowFilterName, FlowRunFilter,
                                                FlowRunFilterState, FlowRunFilterStateType,
                                                FlowRunFilterTags)
    from prefect.client.schemas.objects import StateType

    from tasks.housekeeping import HOST_TAG, OWNER_TAG

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["validate"])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])),
                tags=FlowRunFilterTags(all_=[HOST_TAG + socket.gethostname()])))
    return [r.name for r in runs for t in r.tags
            if t.startswith(OWNER_TAG) and not lifecycle.alive(t[len(OWNER_TAG):])]


def write_target(tmp_path, name, *plugins):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "device": "cpu", "dtype": "bfloat16",
                                    "plugins": [str(p) for p in plugins]}))
    return path


@pytest.mark.integration
@pytest.mark.slow
def test_sigkilled_validate_cleans_up(prefect_server, tmp_path):
    marks, scratch_root = tmp_path / "marks", tmp_path / "tmp"
    marks.mkdir()
    scratch_root.mkdir()
    sleeper = tmp_path / "sleep_forever.py"
    sleeper.write_text(SLEEPER.format(marks=str(marks)))
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "TMPDIR": str(scratch_root)}
    log = tmp_path / "validate.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "day0.cli", "validate", str(MODELS / "tiny-llama"), "--no-cache",
             "--stages", "alignment",
             "--target-file", str(write_target(tmp_path, "cpu-bf16-killed", sleeper))],
            stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        token = lifecycle.owner_token(proc.pid)
        mark = wait_for(lambda: next(marks.iterdir(), None) or proc.poll() is not None, 600, 0.5)
        assert proc.poll() is None, log.read_text()[-3000:]
        stage_pid, grandchild = map(int, mark.read_text().split())
        assert os.getpgid(grandchild) == stage_pid  # the stage's group, as started
        assert list(scratch_root.glob(f"day0-*-{token}-*")), "the running stage has no scratch"

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # no stage process and no scratch folder within a bounded wait, no later start needed
        assert wait_for(lambda: not group_members(stage_pid), 10), group_members(stage_pid)
        assert lifecycle.start_time(stage_pid) is None and lifecycle.start_time(grandchild) is None
        assert wait_for(lambda: not list(scratch_root.glob(f"day0-*-{token}-*")), 10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    (killed,) = runs_of(token)
    assert killed.state.is_running()  # nothing ran to end it: the next start must
    orphan = scratch_root / f"day0-alignment-{token}-zzzzzzzz"  # as if its watchdog died too
    orphan.mkdir()

    broken = breakers.copy_fixture(tmp_path / "zero-layers")
    breakers.edit_config(broken, num_hidden_layers=0)  # a real validate that ends quickly: BROKEN
    nxt = subprocess.run([sys.executable, "-m", "day0.cli", "validate", str(broken),
                          "--target-file", str(write_target(tmp_path, "cpu-bf16-next"))],
                         capture_output=True, text=True, timeout=600, env=env)
    assert nxt.returncode == 5, nxt.stdout[-2000:] + nxt.stderr[-3000:]
    assert not orphan.exists()
    (killed,) = runs_of(token)
    assert killed.state.is_crashed() and f"pid {proc.pid}" in killed.state.message
    assert orphaned_running_runs() == []
