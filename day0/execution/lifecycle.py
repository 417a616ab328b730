"""Stage processes and scratch folders never outlive the day0 process that started them.

The process running ``run_stage`` (a ``day0 validate``, a served flow run, a stage job) is the
stage's *owner*, identified by pid and kernel start time (a reused pid is not the owner). When
the owner dies, even by SIGKILL, which runs no cleanup code:

* the stage child dies at once: it asks for ``PR_SET_PDEATHSIG`` (SIGKILL) first thing;
* a watchdog forked by the stage child, in a process group of its own, kills the stage's whole
  process group (the child's own children too) and removes the stage's scratch folder;
* a scratch folder left anyway (the watchdog was killed too, a crash before it started) is named
  ``day0-<stage>-<owner pid>-<owner start>-<random>`` so that the next start finds and removes
  the ones whose owner is dead (``sweep_scratch``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path

OWNER_ENV = "DAY0_STAGE_OWNER"      # "<pid>-<start>" of the owner, set by run_stage
SCRATCH_ENV = "DAY0_STAGE_SCRATCH"  # the stage's scratch folder, removed if the owner dies
MEMORY_ENV = "DAY0_STAGE_MEMORY_GIB"  # the stage's memory budget (day0.execution.budget.stage_memory_bytes)
SCRATCH_RE = re.compile(r"^day0-[a-z0-9_]+-(?P<pid>[0-9]+)-(?P<start>[0-9]+)-[a-z0-9_]+$")
POLL_S = 0.2
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def start_time(pid: int) -> int | None:
    """Kernel start time (clock ticks since boot) of a live pid; None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name may hold spaces and ')'
    return None if fields[0] in "ZXx" else int(fields[19])


def owner_token(pid: int | None = None) -> str:
    """'<pid>-<start time>' of pid (default: this process); start 0 where /proc is missing."""
    pid = pid or os.getpid()
    return f"{pid}-{start_time(pid) or 0}"


def alive(token: str) -> bool:
    """Whether the process an owner_token names is still running (not a reused pid)."""
    pid, start = (int(p) for p in token.split("-"))
    if Path("/proc/self/stat").exists():
        return start_time(pid) == start if start else start_time(pid) is not None
    try:  # no /proc: the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make_scratch(stage: str, root: str | Path | None = None) -> Path:
    """A private (0700, random suffix) scratch folder under root (default: the temp dir) named
    after this process as its owner."""
    safe = re.sub(r"[^a-z0-9_]", "_", stage.lower())[:32] or "stage"
    return Path(tempfile.mkdtemp(prefix=f"day0-{safe}-{owner_token()}-", dir=root))


def sweep_scratch(root: str | Path | None = None) -> list[Path]:
    """Remove scratch folders under root (default: the temp dir) whose owner is dead; only this
    user's real folders (never through a symlink), so a shared /tmp is safe to sweep."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = SCRATCH_RE.match(entry.name)
        if not match:
            continue
        try:
            info = os.lstat(entry.path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if alive(f"{match['pid']}-{match['start']}"):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent (thread) ends (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def name_process(name: str) -> None:
    """Set this process's name (/proc/PID/comm: what `ps -o comm` and `top` show; 15 bytes
    kept), so that a stage process says which stage it runs (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def kill_group(pgid: int, rounds: int = 50) -> None:
    """SIGKILL every process of group pgid, again while any is left (one may be forking)."""
    for _ in range(rounds):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


def guard_stage() -> None:
    """Called first thing in a stage child started by run_stage (no-op otherwise): die with the
    owner, and fork the watchdog that cleans up after the owner if it dies."""
    owner, scratch = os.environ.get(OWNER_ENV), os.environ.get(SCRATCH_ENV)
    if not owner or not hasattr(os, "fork"):
        return
    die_with_parent()
    if not alive(owner):  # the owner died before prctl took effect: nobody wants the result
        os._exit(137)
    group = os.getpgid(0)
    if os.fork() == 0:
        _watch(owner, scratch, group, os.getppid())


def _watch(owner: str, scratch: str | None, group: int, stage_pid: int) -> None:
    try:
        os.setpgid(0, 0)  # out of the stage's group: killing that group must not kill us first
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # never hold the runner's log pipe open
            os.dup2(devnull, fd)
        while True:
            if not alive(owner):
                kill_group(group)
                if scratch:
                    shutil.rmtree(scratch, ignore_errors=True)
                break
            if os.getppid() != stage_pid:  # the stage ended: its runner cleans up
                break
            time.sleep(POLL_S)
    finally:
        os._exit(0)


__all__ = ["OWNER_ENV", "SCRATCH_ENV", "owner_token", "alive", "make_scratch", "sweep_scratch",
           "guard_stage", "kill_group", "die_with_parent", "start_time"]
