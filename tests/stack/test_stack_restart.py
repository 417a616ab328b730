"""The stack restarts a part (issue 28, part 4), on one real stack for the module: `up` on a
partly running stack starts only what is missing and keeps the rest (pids and ports);
`restart store` and `restart serve` keep every port and stack.json follows them; `down` stops
an orphan of a SIGKILLed `day0 serve` and says only what is true; the next `up` keeps every
port. The ports are given to the first `up` only (DAY0_STACK_*_PORT): every later command
finds them in the state folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from day0.stack import core, procs
from tests.conftest import ROOT
from tests.receiver.support import wait_until
from tests.s3server import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def day0_stack(env: dict, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "day0.cli", "stack", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(layout, env): a stack up, env without any port (the state folder keeps them)."""
    layout = core.Layout(tmp_path_factory.mktemp("stack") / "state")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAY0_STACK_")}
    env["DAY0_STACK_DIR"] = str(layout.root)
    ports = dict(zip(("PREFECT", "RECEIVER", "S3", "MASTER", "VOLUME", "FILER"), free_ports(6)))
    first = {**env, **{f"DAY0_STACK_{name}_PORT": str(p) for name, p in ports.items()}}
    try:
        ok(day0_stack(first, "up", timeout_s=600))
        yield layout, env
    finally:
        day0_stack(env, "down")


def pids(state: core.StackState) -> dict[str, int]:
    return {p.name: p.pid for p in state.procs}


def kill_leader(state: core.StackState, name: str) -> int:
    (proc,) = [p for p in state.procs if p.name == name]
    os.kill(proc.pid, signal.SIGKILL)
    assert wait_until(lambda: not procs.alive(proc.pid, proc.ticks), 10)
    return proc.pid


def all_alive(state: core.StackState) -> bool:
    return [p.name for p in state.procs if procs.alive(p.pid, p.ticks)] == list(core.ORDER)


def test_up_on_a_partly_running_stack_starts_only_what_is_missing(stack):
    layout, env = stack
    before = layout.load()
    kill_leader(before, "prefect")  # the server the others talk to
    said = ok(day0_stack(env, "up"))
    after = layout.load()
    assert after.ports == before.ports and all_alive(after), said
    kept = {k: v for k, v in pids(before).items() if k != "prefect"}
    assert {k: v for k, v in pids(after).items() if k != "prefect"} == kept
    assert pids(after)["prefect"] != pids(before)["prefect"]
    assert "starting prefect" in said and "starting receiver" not in said, said
    assert f"serve (pid {kept['serve']}) polls the new Prefect" in said, said  # it reconnected
    assert httpx.get(after.api_url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("part,name", [("store", "seaweedfs"), ("serve", "serve")])
def test_restart_keeps_every_port_and_stack_json_follows(stack, part, name):
    layout, env = stack
    before = layout.load()
    said = ok(day0_stack(env, "restart", part))
    after = layout.load()
    assert after.ports == before.ports and all_alive(after), said
    old, new = ([p for p in s.procs if p.name == name][0] for s in (before, after))
    assert (new.pid, new.ticks) != (old.pid, old.ticks) and new.ports == old.ports
    assert f"stopped {name} (pid {old.pid})" in said and f"{name} ready" in said, said
    assert {k: v for k, v in pids(after).items() if k != name} == \
        {k: v for k, v in pids(before).items() if k != name}
    if name == "seaweedfs":  # weed's own log files in the state folder, none in /tmp
        assert list((layout.logs / "seaweedfs").glob(f"weed.*.{new.pid}"))
        assert not list(Path("/tmp").glob(f"weed.*.{new.pid}"))


def test_down_stops_an_orphan_of_a_dead_part_then_up_keeps_every_port(stack):
    layout, env = stack
    before = layout.load()
    tree = {q for p in before.procs for q in procs.tree(p.pid)}
    # a stage that made a session of its own: only the marker says it is the stack's
    stage = subprocess.Popen(["sleep", "300"], start_new_session=True,
                             env={**env, **core.marker(layout, "serve")})
    try:
        serve = kill_leader(before, "serve")
        said = ok(day0_stack(env, "down"))
        assert stage.wait(30) == -signal.SIGTERM, said
    finally:
        stage.kill()
    assert f"serve (pid {serve}) was not running; stopped 1 leftover process(es) of it " \
           f"(pids {stage.pid})" in said, said
    assert "stopped prefect" in said and "day0 stack is down" in said, said
    assert not [p for p in tree if procs.alive(p, None)]
    assert not procs.marked(core.marker(layout)), "a process of the stack outlived down"
    assert not [q for p in before.procs for q in p.ports if procs.port_open(q)]
    status = day0_stack(env, "status")
    assert status.returncode == 1 and "not running" in status.stdout, status.stdout

    ok(day0_stack(env, "up"))
    after = layout.load()
    assert after.ports == before.ports and all_alive(after)
    assert [p.ports for p in after.procs] == [p.ports for p in before.procs]
