"""The warm stage host: stages forked from it keep the cold contract (own process, own env,
crash/hang/OOM become failed stages) and the host dying is a crash that names it, never a hang."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from day0.execution import stagehost
from day0.stack import procs
from day0.execution.contract import StageInputs
from day0.execution.stage import StageSpec, run_stage
from day0.execution.targets import resolve_target
from tests.conftest import FIXTURES, PLUGINS

TINY = str(FIXTURES / "models" / "tiny-llama")


@pytest.fixture(scope="module", autouse=True)
def owned_hosts(tmp_path_factory):
    """These tests own their hosts (one module's worth): the session's kept host
    (tests/conftest.py) is out of sight."""
    hosts: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAY0_SERVER_DIR", str(tmp_path_factory.mktemp("server")))
        patch.setattr(stagehost, "_keep", None)
        patch.setattr(stagehost, "_hosts", hosts)
        yield
    for host in hosts.values():
        host.proc.kill()
        host.close()


@pytest.fixture
def kept_beside_anchor():
    """A process the test keeps hosts beside (keep_beside) and kills; meanwhile the module's
    owned hosts are out of sight, and afterwards hosts are owned again."""
    anchor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    owned, stagehost._hosts = stagehost._hosts, {}
    yield anchor
    anchor.kill()
    anchor.wait()
    stagehost._keep, stagehost._hosts = None, owned


def alignment_with(plugin) -> StageSpec:
    target = resolve_target("cpu-bf16").model_copy(update={"plugins": [str(plugin)]})
    return StageSpec(stage="alignment", config={}, inputs=StageInputs(source=TINY, target=target))


def printing_plugin(tmp_path, body: str):
    """A plugin that prints one line about the stage process, then ends the stage (exit 3)."""
    plugin = tmp_path / "tell.py"
    plugin.write_text("import os, sys\n"
                      "def apply(model):\n"
                      f"    print('told:', {body}, flush=True)\n"
                      "    os._exit(3)\n")
    return plugin


def told(lines) -> str:
    return next(line.split("told: ", 1)[1] for line in lines if line.startswith("told: "))


def test_stages_are_forked_from_one_warm_host_with_the_callers_environment(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("DAY0_TEST_MARK", "first")
    plugin = printing_plugin(tmp_path, "os.getppid(), os.environ.get('DAY0_TEST_MARK'), "
                                       "os.getpgrp() == os.getpid(), "
                                       "__import__('tempfile').gettempdir()")
    first, second = [], []
    run_stage(alignment_with(plugin), timeout_s=300, log=first.append)
    host = stagehost.host_for(dict(os.environ))
    assert told(first).startswith(f"{host.proc.pid} first True ")
    # a per-call variable (read after import) reaches the child without a new host, TMPDIR
    # too (tempfile caches the one it saw first: the host's): each stage's is the tmp folder
    # of its own scratch folder, which goes with it
    monkeypatch.setenv("DAY0_TEST_MARK", "second")
    outcome = run_stage(alignment_with(plugin), timeout_s=300, log=second.append)
    pid, mark, leader, tmp = told(second).split(" ")
    assert (pid, mark, leader) == (str(host.proc.pid), "second", "True")
    assert re.fullmatch(r".*/day0-alignment-[0-9]+-[0-9]+-[^/]+/tmp", tmp), tmp
    assert tmp != told(first).split(" ")[3] and not Path(tmp).exists()  # gone with its stage
    assert stagehost.host_for(dict(os.environ)) is host
    assert outcome.failure == "crash" and "exit code 3" in outcome.error


def test_an_import_time_variable_gets_a_host_of_its_own(monkeypatch):
    base = stagehost.host_key(dict(os.environ))
    before = os.environ.get("OMP_NUM_THREADS")  # make test sets it while the waiting lane runs
    monkeypatch.setenv("OMP_NUM_THREADS", "5" if before == "7" else "7")
    assert stagehost.host_key(dict(os.environ)) != base
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")  # children are line-buffered whatever the host
    if before is None:
        monkeypatch.delenv("OMP_NUM_THREADS")
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", before)
    assert stagehost.host_key(dict(os.environ)) == base


def test_disabled_host_starts_the_stage_cold(tmp_path, monkeypatch):
    monkeypatch.setenv(stagehost.DISABLE_ENV, "0")
    lines = []
    run_stage(alignment_with(printing_plugin(tmp_path, "os.getppid()")), timeout_s=300,
              log=lines.append)
    assert told(lines) == str(os.getpid())


def test_hog_in_the_host_is_killed_as_oom_and_the_host_keeps_serving(tmp_path):
    # a child's memory is its own: the limit kills it, not the host it was forked from
    host = stagehost.host_for(dict(os.environ))
    outcome = run_stage(alignment_with(PLUGINS / "hog_memory.py"), timeout_s=300,
                        memory_limit_gib=1.5)
    assert outcome.failure == "oom" and "memory limit" in outcome.error
    # what consumed it, as far as the stage said: the phase it had reached (issue 27)
    assert "(it was at models" in outcome.error, outcome.error
    assert host.alive() and stagehost.host_for(dict(os.environ)) is host
    lines = []
    run_stage(alignment_with(printing_plugin(tmp_path, "os.getppid()")), timeout_s=300,
              log=lines.append)
    assert told(lines) == str(host.proc.pid)


def test_host_dying_mid_stage_is_a_crash_naming_the_host_and_a_new_host_follows(tmp_path):
    plugin = tmp_path / "kill_host.py"
    plugin.write_text("import os, signal, time\n"
                      "def apply(model):\n"
                      "    os.kill(os.getppid(), signal.SIGKILL)\n"
                      "    time.sleep(600)\n")
    host = stagehost.host_for(dict(os.environ))
    started = time.monotonic()
    outcome = run_stage(alignment_with(plugin), timeout_s=300)
    assert time.monotonic() - started < 120, "a dead host must not leave the stage waiting"
    assert outcome.failure == "crash"
    assert f"warm stage host (pid {host.proc.pid}) died" in outcome.error
    assert stagehost.host_for(dict(os.environ)) is not host


def test_host_leaves_with_its_owner():
    # the owner exits without closing anything (os._exit): the host sees its stdin close
    owner = subprocess.run(
        [sys.executable, "-c",
         "import os; from day0.execution import stagehost\n"
         "h = stagehost.host_for(dict(os.environ)); h._ready.wait(300)\n"
         "print(h.proc.pid, h.alive(), flush=True); os._exit(0)"],
        capture_output=True, text=True, timeout=300)
    pid, alive = owner.stdout.split()
    assert alive == "True", owner.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:  # gone, or a zombie waiting for whichever process adopted it
            if " Z " in open(f"/proc/{pid}/stat").read():
                break
        except FileNotFoundError:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"stage host {pid} outlived its owner")


def wait_gone(pid: int, ticks, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while procs.alive(pid, ticks) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not procs.alive(pid, ticks)


def test_a_kept_host_serves_other_processes_and_leaves_with_its_anchor(tmp_path,
                                                                        kept_beside_anchor):
    anchor = kept_beside_anchor
    stagehost.keep_beside(anchor.pid, procs.start_ticks(anchor.pid), idle_s=600)
    host = stagehost.host_for(dict(os.environ))
    assert isinstance(host, stagehost.KeptHost)
    lines = []
    run_stage(alignment_with(printing_plugin(tmp_path, "os.getppid()")), timeout_s=300,
              log=lines.append)
    assert told(lines) == str(host.pid)
    assert any(f"forked from the kept stage host (pid {host.pid}" in line for line in lines)
    # another process with the same environment finds it (and starts none of its own)
    other = subprocess.run(
        [sys.executable, "-c", "import os; from day0.execution import stagehost\n"
         "h = stagehost.host_for(dict(os.environ)); print(type(h).__name__, h.pid)"],
        capture_output=True, text=True, timeout=120)
    assert other.stdout.split() == ["KeptHost", str(host.pid)], other.stderr
    anchor.kill()  # the server's watcher, say, stopped
    assert wait_gone(host.pid, host.ticks, 30), "a kept host outlived its anchor"
    assert not host.record.exists() and not os.path.exists(host.socket_path)
    assert stagehost.KeptHost.find(stagehost.host_key(dict(os.environ))) is None


def test_a_kept_host_leaves_when_idle_and_a_code_change_gets_a_new_one(kept_beside_anchor):
    anchor = kept_beside_anchor
    stagehost.keep_beside(anchor.pid, procs.start_ticks(anchor.pid), idle_s=2)
    host = stagehost.host_for(dict(os.environ))
    host._wait_ready()
    key = stagehost.host_key(dict(os.environ))
    assert stagehost.KeptHost.find(key).pid == host.pid
    source = Path(stagehost.__file__)
    before = source.stat()
    os.utime(source, ns=(before.st_atime_ns, time.time_ns() + 10**10))
    try:  # an edited day0 is not the code the host imported: it is not found any more
        assert stagehost.KeptHost.find(key) is None
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert wait_gone(host.pid, host.ticks, 30), "an idle kept host stayed"
    assert not host.record.exists()


def test_every_preload_and_every_stages_warm_up_of_the_host_resolves():
    """The host's warm-up fails silently (a stage then pays the cost itself): each shared module
    of stagehost.yaml imports here, names no stage, and every registered stage's core loads and
    warms."""
    import importlib

    import yaml

    from day0 import DATA_DIR, stages

    data = yaml.safe_load((DATA_DIR / "stagehost.yaml").read_text())
    assert set(data) == {"preload"}
    for name in data["preload"]:
        importlib.import_module(name)
        assert not name.startswith("day0.stages"), f"{name}: stages warm through their own hook"
    for name in stages.names():
        stages.get(name).load()
        stages.get(name).warm()
