"""Processes and ports of the hand-run stack: start in a session, identify, stop for good.

A process is named by (pid, start time in clock ticks from /proc/<pid>/stat), so a pid the
kernel reused for someone else's process is never signalled. Stopping takes the whole tree:
the process group, every process of its session and every descendant (a stage child may have
made a session of its own), SIGTERM first, SIGKILL after a grace. The leader may be dead
already: its session outlives it, and what carries the caller's environment marker (the stack
sets one in every process it starts) is found however it was re-parented.
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


def _table() -> dict[int, tuple[str, int, int, int]]:
    """stat() of every process now."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (s := stat(int(entry.name))) is not None:
            found[int(entry.name)] = s
    return found


def _descendants(roots: set[int], table: dict) -> set[int]:
    found = set(roots)
    grew = True
    while grew:
        kids = {p for p, s in table.items() if s[1] in found} - found
        grew = bool(kids)
        found |= kids
    return found


def tree(pid: int) -> set[int]:
    """pid, its descendants and the members of its session (pid is a session leader)."""
    table = _table()
    return _descendants({pid} | {p for p, s in table.items() if s[2] == pid}, table)


def marked(marker: dict[str, str]) -> set[int]:
    """Processes of this user whose environment (as they were started) holds every NAME=VALUE
    of marker: children inherit it whatever their session or parent became."""
    want = {f"{k}={v}".encode() for k, v in marker.items()}
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == os.getuid():
                if want <= set((entry / "environ").read_bytes().split(b"\0")):
                    found.add(int(entry.name))
        except OSError:  # gone, or not readable (another user's, a setuid one)
            pass
    return found


def _ancestors() -> set[int]:
    """This process and its ancestors: never signalled (a stack command run from a stack
    process must not kill itself)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        pid = (stat(pid) or ("", 0))[1]
    return found


def members(pid: int | None, ticks: int | None,
            marker: dict[str, str] | None = None) -> dict[int, int]:
    """{pid: start ticks} of what belongs to the process (pid, ticks), alive or dead: it, its
    session (which outlives it: the kernel reuses no pid still naming a session), what carries
    marker, and every descendant of those. A reused pid (other ticks) names nobody's session;
    pid None: only what carries marker."""
    table = _table()
    own = table.get(pid) if pid else None
    reused = own is not None and ticks is not None and own[3] != ticks
    roots = set()
    if pid and pid > 0 and not reused:
        roots = {pid} | {p for p, s in table.items() if s[2] == pid}
    if marker:
        roots |= marked(marker)
    found = _descendants(roots, table) - _ancestors()
    return {p: table[p][3] for p in found if p in table and table[p][0] not in ("Z", "X")}


def _signal(pids: set[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_all(pid: int | None, ticks: int | None, *, marker: dict[str, str] | None = None,
             grace_s: float = 15.0) -> tuple[set[int], set[int]]:
    """SIGTERM what belongs to (pid, ticks) (see members; the leader may be dead already),
    SIGKILL what is left after grace_s, looking again for what was born meanwhile.
    Returns (the pids found alive, the pids still alive at the end)."""
    found = members(pid, ticks, marker)
    if not found:
        return set(), set()
    if pid in found:  # the group also reaches a child forked after the scan
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    _signal(set(found), signal.SIGTERM)
    left = _wait_gone(found, grace_s)
    if left:
        left |= members(pid, ticks, marker)
        _signal(set(left), signal.SIGKILL)
        left = _wait_gone(left, 10.0)
    return set(found), set(left)


def stop(pid: int, ticks: int | None, *, grace_s: float = 15.0) -> bool:
    """stop_all without a marker; True when nothing of it is left."""
    return not stop_all(pid, ticks, grace_s=grace_s)[1]


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
        # as the servers bind (uvicorn and Go set SO_REUSEADDR): a port whose last server just
        # stopped keeps TIME_WAIT connections for a minute, which block a plain bind but no
        # server; only a listener (or a socket bound without the option) makes it taken
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
