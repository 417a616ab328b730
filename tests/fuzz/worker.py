"""Runs `day0 analyze` on one checkpoint after another, each in a forked child under a memory
ceiling and a timeout; the parent is warmed up once so a mutant costs milliseconds, not the
seconds of importing torch and transformers.

Protocol (JSON lines): stdin ``{"path": ..., "timeout_s": ..., "mem_bytes": ...}``, stdout
``{"rc", "stderr", "seconds", "rss_growth", "killed"}``. ``rc`` is the CLI's exit status, or None
when the child was killed (``killed``: "timeout" or "signal N"). The child's address space may
grow by at most ``mem_bytes`` (RLIMIT_AS): an allocation past it fails inside day0, which must
then not pass as a clean exit. ``rss_growth`` is its peak resident memory (VmHWM) above what it
started with.

Started by tests/fuzz/harness.py as ``python -m tests.fuzz.worker WARMUP_FOLDER...``.
"""

from __future__ import annotations

import io
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stdout
from pathlib import Path


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _child(path: str, mem_bytes: int, err_fd: int, info_fd: int) -> None:
    """In the forked child: limit memory, run the CLI, report, exit without cleanup."""
    rc = 99
    start_rss = _status("VmRSS")
    try:
        limit = _status("VmSize") + mem_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        os.dup2(err_fd, 2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # fd 1 is the parent's protocol channel
        from day0.cli import main

        with redirect_stdout(io.StringIO()):  # the analysis text itself is not under test
            rc = main(["analyze", path])
    except BaseException:  # anything escaping main is a finding: keep its traceback
        traceback.print_exc()
        rc = 98
    finally:
        try:
            sys.stderr.flush()
            os.write(info_fd, json.dumps({"rss_growth": _status("VmHWM") - start_rss}).encode())
        finally:
            os._exit(rc if isinstance(rc, int) and 0 <= rc < 256 else 97)


def run_one(path: str, timeout_s: float, mem_bytes: int) -> dict:
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as info:
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(path, mem_bytes, err.fileno(), info.fileno())
        killed = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - started > timeout_s:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                killed = "timeout"
                status = None
                break
            time.sleep(0.002)
        seconds = time.monotonic() - started
        rc = None
        if status is not None:
            if os.WIFEXITED(status):
                rc = os.WEXITSTATUS(status)
            else:
                killed = f"signal {os.WTERMSIG(status)}"
        err.seek(0)
        info.seek(0)
        extra = json.loads(info.read() or b"{}")
        return {"rc": rc, "stderr": err.read().decode("utf-8", "replace"), "seconds": seconds,
                "rss_growth": extra.get("rss_growth"), "killed": killed}


def main(argv: list[str]) -> int:
    import torch

    torch.set_num_threads(1)  # children only read headers and build on meta; no thread pools
    from day0.cli import main as cli

    for folder in argv:  # import every model class and data file once, in the parent
        with redirect_stdout(io.StringIO()):
            cli(["analyze", folder])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        print(json.dumps(run_one(job["path"], job["timeout_s"], job["mem_bytes"])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
