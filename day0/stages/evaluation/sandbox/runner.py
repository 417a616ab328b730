"""Runs model-written programs one by one inside the sandbox (standard library only: it is run
as a file, `python -I runner.py`, in a fresh namespace or a container, never imported by day0).

stdin: one JSON object {"programs": [source, ...], "limits": {...}, "python": the interpreter the
programs run with (none: the runner's), "scratch_root": where the scratch folders go (default
/tmp/scratch), "isolate": bool, "separate_user": bool}.
stdout: one JSON line per program, in order: {"index", "status", "returncode", "stderr"}, status
one of passed (exit 0), failed (non-zero exit), timeout (the wall limit; its process group is
killed), killed (a signal: the memory or CPU limit, or its own).

With "isolate" (the process backend starts this file under `unshare --net --mount --pid`):
every mount of the new mount namespace is remounted read-only, and an empty size-limited tmpfs
hides /tmp, /var/tmp and /dev/shm. With "separate_user" (the runner is root: the process backend
started by root, or the container) each program runs as `nobody`: no capability, no file that is not
world-readable (credentials, the results store's folders). Each program gets an empty scratch folder, its working directory and
the only place it can write, and a clean environment (no secret is inherited).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time

NOBODY = 65534
HIDDEN = ("/tmp", "/var/tmp", "/dev/shm")  # each replaced by an empty tmpfs


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


def isolate(scratch_mib: int) -> None:
    """Remount everything read-only in this mount namespace, then hide HIDDEN under tmpfs."""
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle]
    for point in sorted(set(points), key=len):
        if point.startswith(("/proc", "/sys")):
            continue  # a fresh /proc (--mount-proc); /sys is read-only in a new namespace
        # a mount this user may not remount (locked in a user namespace) stays as it is: the
        # checks after the loop are what must hold
        subprocess.run(["mount", "-o", "remount,bind,ro", point], capture_output=True, timeout=30)
    for point in HIDDEN:
        if os.path.isdir(point):
            size = f"{scratch_mib}m" if point == "/tmp" else "1m"
            _mount("-t", "tmpfs", "-o", f"size={size},mode=0755,nosuid,nodev", "tmpfs", point)
    probe = "/.day0-sandbox-probe"
    try:
        open(probe, "w").close()
    except OSError:
        return
    os.unlink(probe)
    raise SystemExit("sandbox: the root file system is still writable after remounting")


def _nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _limits(limits: dict, drop_to_nobody: bool):
    def apply() -> None:
        os.setsid()
        memory = int(limits["memory_mib"]) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(limits["timeout_s"]) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        size = int(limits["file_kib"]) * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if drop_to_nobody:
            _nobody()
            # per user: only this program's processes are nobody's in this pid namespace
            processes = int(limits["processes"])
            resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    return apply


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_one(index: int, source: str, python: str, limits: dict, drop_to_nobody: bool,
            scratch_root: str) -> dict:
    scratch = os.path.join(scratch_root, str(index))
    # searchable by others: the runner (root without capabilities) starts the program in it
    os.makedirs(scratch, mode=0o711)
    path = os.path.join(scratch, "program.py")
    with open(path, "w") as handle:
        handle.write(source)
    if drop_to_nobody:  # written first: a root without capabilities cannot write into it after
        os.chown(path, NOBODY, NOBODY)
        os.chown(scratch, NOBODY, NOBODY)
    env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    proc = subprocess.Popen([python, "-I", "-B", path], cwd=scratch, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=_limits(limits, drop_to_nobody))
    try:
        _, err = proc.communicate(timeout=float(limits["timeout_s"]))
        status = "passed" if proc.returncode == 0 else (
            "killed" if proc.returncode < 0 else "failed")
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        _, err = proc.communicate()
        status = "timeout"
    finally:
        _kill_group(proc.pid)  # what it left running (a daemonized child) ends with it
        # removed by its owner (a root without capabilities may not enter it)
        subprocess.run(["rm", "-rf", scratch], timeout=60,
                       preexec_fn=_nobody if drop_to_nobody else None)
    tail = (err or b"")[-600:].decode(errors="replace")
    return {"index": index, "status": status, "returncode": proc.returncode, "stderr": tail,
            "seconds": round(time.monotonic() - started, 3)}


def main() -> int:
    if len(sys.argv) > 1:  # the container reads its request from a read-only mount
        with open(sys.argv[1]) as handle:
            request = json.load(handle)
    else:
        request = json.load(sys.stdin)
    limits = request["limits"]
    if request.get("isolate"):
        isolate(int(limits["scratch_mib"]))
    scratch_root = request.get("scratch_root") or "/tmp/scratch"
    os.makedirs(scratch_root, mode=0o755, exist_ok=True)
    drop = bool(request.get("separate_user"))
    python = request.get("python") or sys.executable  # none named: the runner's own
    for index, source in enumerate(request["programs"]):
        print(json.dumps(run_one(index, source, python, limits, drop, scratch_root)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
