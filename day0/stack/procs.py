"""Processes and ports of the hand-run stack: start in a session, identify, stop for good.

A process is named by (pid, start time in clock ticks from /proc/<pid>/stat), so a pid the
kernel reused for someone else's process is never signalled. Stopping takes the whole tree:
the process group, every process of its session and every descendant seen before the first
signal (a stage child may have made a session of its own), SIGTERM first, SIGKILL after a grace.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

GRPC_OFFSET = 10000  # SeaweedFS serves gRPC on each HTTP port + 10000


def stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, session id, start ticks) of pid, or None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = raw[raw.rfind(")") + 2:].split()  # the command name may hold spaces and ')'
    return fields[0], int(fields[1]), int(fields[3]), int(fields[19])


def start_ticks(pid: int) -> int | None:
    s = stat(pid)
    return s[3] if s else None


def alive(pid: int, ticks: int | None) -> bool:
    """Is pid still the process we started (same start time, not a zombie)?"""
    s = stat(pid)
    return s is not None and s[0] not in ("Z", "X") and (ticks is None or s[3] == ticks)


def spawn(cmd: list[str], *, env: dict, cwd: Path, log: Path) -> subprocess.Popen:
    """cmd in its own session (a group to signal), output appended to log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def tree(pid: int) -> set[int]:
    """pid, its descendants and the members of its session (pid is a session leader)."""
    parents: dict[int, int] = {}
    found = {pid}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        s = stat(int(entry.name))
        if s is None:
            continue
        parents[int(entry.name)] = s[1]
        if s[2] == pid:
            found.add(int(entry.name))
    grew = True
    while grew:
        kids = {p for p, parent in parents.items() if parent in found} - found
        grew = bool(kids)
        found |= kids
    return found


def _signal(pids: set[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop(pid: int, ticks: int | None, *, grace_s: float = 15.0) -> bool:
    """SIGTERM the tree of pid (if it is still ours), SIGKILL what is left after grace_s;
    True when nothing of it is left."""
    if not alive(pid, ticks):
        return True
    members = {p: start_ticks(p) for p in tree(pid)}
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    _signal(set(members), signal.SIGTERM)
    left = _wait_gone(members, grace_s)
    if left:
        _signal(set(left), signal.SIGKILL)
        left = _wait_gone(left, 10.0)
    return not left


def _wait_gone(members: dict[int, int | None], timeout_s: float) -> dict[int, int | None]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = {p: t for p, t in members.items() if alive(p, t)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Does something accept connections on host:port?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def port_free(port: int) -> bool:
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: list[int | None], taken: set[int], *, grpc: bool = False) -> int:
    """The first preferred port that is free (with its gRPC twin when grpc), else a random one."""
    def usable(p: int) -> bool:
        ports = (p, p + GRPC_OFFSET) if grpc else (p,)
        return all(q not in taken and port_free(q) for q in ports)

    for p in preferred:
        if p and usable(p):
            return p
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(2000):
        p = rng.randrange(20000, 45000)  # + 10000 stays below 55536
        if usable(p):
            return p
    raise OSError("no free port found between 20000 and 45000")


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
