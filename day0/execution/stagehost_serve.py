"""The warm stage host's own side (``python -m day0.execution.stagehost_serve SOCKET [KEEP]``): import the
stack once, then fork one stage child per request and tell its requester the child's pid and
exit code. The owner's side, and what a forked child keeps and shares, is day0.execution.stagehost."""

from __future__ import annotations

import atexit
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from day0.atomic import write_atomic
from day0.stack import procs


def _child(request: dict, out_fd: int, listener: socket.socket, stdin_fd: int) -> None:
    """In the forked child: become the stage process the request describes, never return."""
    code = 70
    try:
        listener.close()
        os.close(stdin_fd)
        os.setpgid(0, 0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # re-read TMPDIR: the host's may have been cached at import
        os.chdir(request["cwd"])
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [request["cwd"]] + [p for p in extra if p not in sys.path] + sys.path[1:]
        module_name, _, function_name = request["entry"].partition(":")
        sys.argv = [module_name, *request["argv"]]
        sys.stdout.reconfigure(line_buffering=True, write_through=True)
        sys.stderr.reconfigure(line_buffering=True, write_through=True)
        from day0.execution import memory
        memory.forget_peak_rss()  # the peak is the stage's own, not the host's
        # By name, as `python -m` would: the host knows no stage code (and imports none upward).
        entry = getattr(importlib.import_module(module_name), function_name or "main")
        try:
            code = entry(request["argv"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        try:
            atexit._run_exitfuncs()
        except Exception:  # noqa: BLE001 - exit handlers must not change the stage's status
            pass
    except BaseException:  # noqa: BLE001 - a fork child never returns into the host's loop
        import traceback
        traceback.print_exc()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def _status_code(status: int) -> int:
    """As subprocess.Popen.returncode: the exit code, or minus the signal that killed it."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def warm_up() -> None:
    """What every stage would otherwise import or compute in its own process, done once before
    the first fork: stagehost.yaml's shared modules, then each registered stage's core and its
    warm() hook (day0.execution.contract.Stage). A failure only means a stage pays it itself (and reports
    what is missing)."""
    import yaml

    from day0 import DATA_DIR, stages

    for name in yaml.safe_load((DATA_DIR / "stagehost.yaml").read_text())["preload"]:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a child imports what is missing, and reports it
            pass
    for name in stages.names():
        try:
            stage = stages.get(name)
            stage.load()
            stage.warm()
        except Exception:  # noqa: BLE001 - the stage pays it itself, or reports it
            pass


def serve(socket_path: str, keep: dict | None = None) -> None:
    """The host's loop: fork a child per request, tell its requester the pid and the exit code.
    Owned: until its owner's stdin closes. Kept (keep: record, anchor, idle_s): until idle_s
    without a child, or its anchor process is gone; registered in `record` while it serves."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides when stages stop
    warm_up()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    os.chmod(socket_path, 0o600)
    listener.listen(16)
    stdin_fd = sys.stdin.fileno()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listen")
    if keep is None:
        selector.register(stdin_fd, selectors.EVENT_READ, "owner")
    waiting: dict[int, socket.socket] = {}  # child pid -> its requester's connection
    sys.stderr.write("ready\n")
    sys.stderr.flush()
    if keep is not None:
        record = Path(keep["record"])
        write_atomic(record, json.dumps({"pid": os.getpid(), "ticks": procs.start_ticks(
            os.getpid()), "socket": socket_path, "ready": True}))
        try:
            _serve_loop(selector, listener, stdin_fd, waiting, keep)
        finally:
            _unregister(record, socket_path)
        return
    _serve_loop(selector, listener, stdin_fd, waiting, None)


def _unregister(record: Path, socket_path: str) -> None:
    try:
        if json.loads(record.read_text()).get("pid") == os.getpid():
            record.unlink()
    except (OSError, ValueError):
        pass
    Path(socket_path).unlink(missing_ok=True)
    try:
        os.rmdir(Path(socket_path).parent)
    except OSError:
        pass


def _serve_loop(selector, listener, stdin_fd: int, waiting: dict, keep: dict | None) -> None:
    last_busy = checked = time.monotonic()
    while True:
        if keep is not None:
            now = time.monotonic()
            if waiting:
                last_busy = now
            elif now - last_busy > keep["idle_s"]:
                return
            if now - checked > 1.0:
                checked = now
                if not procs.alive(*keep["anchor"]):
                    return
        for key, _ in selector.select(timeout=0.1):
            if key.data == "owner":
                if not os.read(stdin_fd, 4096):  # the owner is gone: so are we (children too)
                    return
            else:
                conn, _ = listener.accept()
                pid = _fork_for(conn, listener, stdin_fd)
                if pid is None:
                    conn.close()
                else:
                    waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"exit": _status_code(status)}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()


def _fork_for(conn: socket.socket, listener: socket.socket, stdin_fd: int) -> int | None:
    conn.settimeout(10)
    try:
        header, fds, _, _ = socket.recv_fds(conn, 8, 1)
        if len(header) != 8 or len(fds) != 1:
            return None
        size, body = int.from_bytes(header, "big"), b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                return None
            body += chunk
        request = json.loads(body)
    except (OSError, ValueError):
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(request, fds[0], listener, stdin_fd)
    os.close(fds[0])
    try:
        os.setpgid(pid, pid)  # also here: the owner may signal the group before the child ran
    except OSError:
        pass
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:
        pass
    return pid


if __name__ == "__main__":
    serve(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else None)
