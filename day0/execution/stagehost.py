"""The warm stage host: stage processes forked from a process that has already imported the stack.

A cold ``python -m day0.execution.stage`` pays for importing torch, transformers, lm-eval and day0 before
its first line of work (seconds per stage, most of a small model's validation). The host pays
that once: ``python -m day0.execution.stagehost_serve`` (the host's side) imports the stack, then forks
one child per stage request. A child is the same contract as a cold stage process
(``day0.execution.stage.main`` with SPEC.json and RESULT.json), and keeps what ``run_stage`` relies on:

* its own process group (killed whole on timeout or memory), its own memory (returned to the OS
  when it exits; its peak RSS is reset at start, so it does not report the host's);
* the owner's environment and working directory of the moment it was asked for;
* ``lifecycle.guard_stage``: it dies with the host (PR_SET_PDEATHSIG) and with its owner.

What a forked child shares with the host, unlike a cold process: the modules imported before the
fork (a stage sees the code of the moment the host started) and their import-time settings. So a
host is keyed by the environment variables read at import time (``IMPORT_TIME_ENV``, the Python
executable): a change gives a new host. The host runs no torch work itself (no thread pools to
inherit) and is single-threaded, so forking it is safe.

The host exits when its owner goes (its stdin closes). A host that dies while a stage runs is seen
by the owner as a closed connection: ``HostedProcess.host_died`` (an ERROR naming the host).

A kept host (``KeptHost``) outlives the command that started it: beside the kept Prefect server
(`day0 server`), the first `day0 validate` leaves its host running, registered under the
server's folder by its key, and every later day0 process with the same key forks its stages
from it instead of importing the stack again. Its key also holds a stamp of the code it imported
(day0's sources, the site-packages folders): an edit or an install gives a new host. It leaves
after the server's idle time without a stage, or within a second of the server's watcher.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from day0.execution import lifecycle
from day0.atomic import write_atomic
from day0.store.paths import server_home
from day0.stack import procs

# read when a module is imported (libgomp's thread count, hub offline mode, ...): a forked child
# would keep the host's values, so they are part of the host's key
IMPORT_TIME_ENV = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOTO", "TORCH", "PYTORCH", "CUDA",
                   "NVIDIA", "HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "DATASETS",
                   "LD_", "PYTHON", "MALLOC", "DAY0_STAGE_HOST")
# one stage's own settings (its owner, its scratch folder): a child gets them, the host does not
PER_STAGE_ENV = (lifecycle.OWNER_ENV, lifecycle.SCRATCH_ENV, lifecycle.MEMORY_ENV)
DISABLE_ENV = "DAY0_STAGE_HOST"  # "0": every stage starts cold, as `python -m day0.execution.stage`
SERVE_MODULE = "day0.execution.stagehost_serve"  # the host process: `python -m SERVE_MODULE SOCKET [KEEP]`
START_TIMEOUT_S = 300.0


def enabled() -> bool:
    return os.environ.get(DISABLE_ENV, "1") != "0" and hasattr(os, "fork") \
        and hasattr(socket, "send_fds")


def host_key(env: dict[str, str]) -> tuple:
    # PYTHONUNBUFFERED: a child's stdout is made line-buffered whatever the host had
    return (sys.executable, tuple(sorted((k, v) for k, v in env.items()
                                         if k.startswith(IMPORT_TIME_ENV)
                                         and k != "PYTHONUNBUFFERED")))


class HostUnavailable(RuntimeError):
    """The host could not be started or reached: the caller starts the stage cold instead."""


class HostedProcess:
    """A stage child of the host, with the slice of subprocess.Popen that run_stage uses."""

    def __init__(self, conn: socket.socket, stdout, pid: int, host_pid: int):
        self._conn, self.stdout, self.pid, self.host_pid = conn, stdout, pid, host_pid
        self.returncode: int | None = None
        self.host_died = False
        self._buffer = b""

    def _read(self, block: bool, timeout: float | None = None) -> None:
        self._conn.setblocking(block)
        if block and timeout is not None:
            self._conn.settimeout(max(timeout, 0.001))
        try:
            chunk = self._conn.recv(4096)
        except (BlockingIOError, TimeoutError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the host went away before saying how the child ended
            self.host_died, self.returncode = True, -signal.SIGKILL
            return
        self._buffer += chunk
        if b"\n" in self._buffer:
            self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["exit"])

    def poll(self) -> int | None:
        while self.returncode is None:
            before = len(self._buffer)
            self._read(block=False)
            if self.returncode is None and len(self._buffer) == before:
                break
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("day0.execution.stage", timeout)
            self._read(block=True, timeout=None if deadline is None
                       else deadline - time.monotonic())
        self._conn.close()
        return self.returncode


class _Host:
    """What an owner needs of a host: its pid, its socket, whether it is ready and alive."""

    pid: int
    socket_path: str

    def alive(self) -> bool:
        raise NotImplementedError

    def _wait_ready(self) -> None:
        """Return once the host forks; HostUnavailable when it never will."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def spawn(self, entry: str, argv: list[str], env: dict[str, str], cwd: str) -> HostedProcess:
        """Fork a child that runs `entry` ("module:function", called with argv, as `python -m`)."""
        self._wait_ready()
        read_end, write_end = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.socket_path)
            request = json.dumps({"entry": entry, "argv": argv, "env": env, "cwd": cwd}).encode()
            socket.send_fds(conn, [len(request).to_bytes(8, "big") + request], [write_end])
            os.close(write_end)
            write_end = -1
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = conn.recv(256)
                if not chunk:
                    raise OSError("connection closed")
                reply += chunk
            pid = int(json.loads(reply)["pid"])
        except (OSError, ValueError, KeyError) as exc:
            conn.close()
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
            raise HostUnavailable(f"stage host (pid {self.pid}) did not fork: {exc}") from exc
        return HostedProcess(conn, os.fdopen(read_end, "r", errors="replace"), pid, self.pid)


class StageHost(_Host):
    """One warm host process owned by this one; `spawn` forks a stage child from it."""

    def __init__(self, env: dict[str, str]):
        # owner-named: swept by a later validation should this process die without closing it
        self._dir = str(lifecycle.make_scratch("host"))
        self.socket_path = str(Path(self._dir) / "host.sock")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", SERVE_MODULE, self.socket_path], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
            env={k: v for k, v in env.items() if k not in PER_STAGE_ENV})
        self._ready = threading.Event()
        self._error: str | None = None
        threading.Thread(target=self._await_ready, daemon=True).start()

    def _await_ready(self) -> None:
        line = self.proc.stderr.readline().decode(errors="replace").strip()
        if line != "ready":
            self._error = line or f"exited with code {self.proc.wait()}"
        self._ready.set()
        for _ in self.proc.stderr:  # keep the pipe drained (import warnings)
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None and self._error is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_ready(self) -> None:
        if not self._ready.wait(START_TIMEOUT_S) or self._error or not self.alive():
            raise HostUnavailable(f"stage host (pid {self.proc.pid}) did not start: "
                                  f"{self._error or 'timed out'}")

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the host's signal to leave
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        for name in ("host.sock",):
            Path(self._dir, name).unlink(missing_ok=True)
        os.rmdir(self._dir) if os.path.isdir(self._dir) else None


def code_stamp() -> str:
    """What a kept host has imported, as mtimes: day0's sources (an edit) and the site-packages
    folders (an install adds or removes entries). A few hundred stat calls, milliseconds."""
    package = Path(__file__).resolve().parents[1]
    newest = max((p.stat().st_mtime_ns for p in package.rglob("*.py")), default=0)
    sites = sorted({p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)})
    return ":".join([str(newest), *(str(os.stat(p).st_mtime_ns) for p in sites)])


def kept_dir() -> Path:
    return server_home() / "hosts"


class KeptHost(_Host):
    """A host kept between commands, registered by its key under kept_dir(); any day0 process
    with that key forks its stages from it. Not this process's to close."""

    def __init__(self, record: Path, pid: int, ticks: int | None, socket_path: str):
        self.record, self.pid, self.ticks, self.socket_path = record, pid, ticks, socket_path
        self._proc: subprocess.Popen | None = None  # set when this process started it

    @staticmethod
    def record_for(key: tuple) -> Path:
        digest = hashlib.sha256(repr((key, code_stamp())).encode()).hexdigest()[:20]
        return kept_dir() / f"{digest}.json"

    @classmethod
    def find(cls, key: tuple) -> KeptHost | None:
        record = cls.record_for(key)
        try:
            state = json.loads(record.read_text())
            host = cls(record, int(state["pid"]), state.get("ticks"), str(state["socket"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        # one still importing is found too (it registers when started): never a second one
        return host if host.alive() and (os.path.exists(host.socket_path)
                                         or not state.get("ready")) else None

    @classmethod
    def start(cls, env: dict[str, str], key: tuple, anchor: tuple[int, int | None],
              idle_s: float) -> KeptHost:
        """Start one in a session of its own; it registers itself once it forks."""
        record = cls.record_for(key)
        record.parent.mkdir(parents=True, exist_ok=True)
        socket_path = str(Path(tempfile.mkdtemp(prefix="day0-kept-host-")) / "host.sock")
        keep = {"record": str(record), "anchor": list(anchor), "idle_s": idle_s}
        proc = procs.spawn([sys.executable, "-m", SERVE_MODULE, socket_path, json.dumps(keep)],
                           env={k: v for k, v in env.items() if k not in PER_STAGE_ENV},
                           cwd=record.parent, log=record.with_suffix(".log"))
        host = cls(record, proc.pid, procs.start_ticks(proc.pid), socket_path)
        host._proc = proc  # reaped here if it dies while this process waits for it
        write_atomic(record, json.dumps({"pid": host.pid, "ticks": host.ticks,
                                         "socket": socket_path, "ready": False}))
        return host

    def alive(self) -> bool:
        return procs.alive(self.pid, self.ticks)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                state = json.loads(self.record.read_text())
                if state.get("pid") == self.pid and state.get("ready"):
                    return
            except (OSError, ValueError):
                pass
            if (self._proc is not None and self._proc.poll() is not None) or not self.alive():
                raise HostUnavailable(f"kept stage host (pid {self.pid}) exited before it was "
                                      f"ready: see {self.record.with_suffix('.log')}")
            time.sleep(0.05)
        raise HostUnavailable(f"kept stage host (pid {self.pid}) not ready in "
                              f"{START_TIMEOUT_S:g} s")


_keep: dict | None = None  # set by keep_beside(): new hosts are kept, anchored there


def keep_beside(anchor_pid: int, anchor_ticks: int | None, idle_s: float) -> None:
    """From now on, a host this process needs is a kept one that leaves when the process
    (anchor_pid, anchor_ticks) is gone or after idle_s without a stage: the kept server's."""
    global _keep
    _keep = {"anchor": (anchor_pid, anchor_ticks), "idle_s": float(idle_s)}


_hosts: dict[tuple, _Host] = {}
_hosts_lock = threading.Lock()
MAX_HOSTS = 2  # each holds the imported stack (~1 GiB): older ones are closed


def host_for(env: dict[str, str]) -> _Host:
    """The warm host for this environment: one already used here, a kept one with the same
    key, or one started now (in the background): kept after keep_beside(), else owned."""
    key = host_key(env)
    with _hosts_lock:
        host = _hosts.get(key)
        if host is not None and not host.alive():
            _hosts.pop(key).close()
            host = None
        if host is None:
            while len(_hosts) >= MAX_HOSTS:
                _hosts.pop(next(iter(_hosts))).close()
            host = KeptHost.find(key)
            if host is None and _keep is not None:
                host = KeptHost.start(env, key, **_keep)
            _hosts[key] = host = host or StageHost(env)
        else:
            _hosts[key] = _hosts.pop(key)  # most recently used last
        return host


def prewarm(env: dict[str, str] | None = None) -> None:
    """Start the host for this environment now, so its imports overlap other start-up work."""
    if enabled():
        host_for(dict(os.environ if env is None else env))


@atexit.register
def close_all() -> None:
    with _hosts_lock:
        while _hosts:
            _hosts.popitem()[1].close()
