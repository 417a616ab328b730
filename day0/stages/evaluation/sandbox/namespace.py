"""The process backend: the runner under `unshare` (util-linux) in new network, mount and pid
namespaces. Started by root, each program then runs as `nobody`; started by another user, a user
namespace maps that user to root inside (the mounts can be made read-only) and the programs keep
that user's identity outside. The network namespace has only a loopback that is down."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from day0.stages.evaluation.sandbox.contract import (RUNNER, Limits, Outcome, SandboxError, parse,
                                                      request)

SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
_checked: dict[bool, str | None] = {}


def _as_root() -> bool:
    return os.geteuid() == 0


def unshare_argv() -> list[str]:
    user = [] if _as_root() else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "--mount", "--pid", "--fork", "--mount-proc",
            "--kill-child"]


def world_runnable(path: str) -> bool:
    """Whether a user with no rights of its own can run this interpreter: every folder on the
    way world-searchable, the file and its shared library world-readable and executable."""
    real = Path(os.path.realpath(path))
    if not real.is_file():
        return False
    parts = [real, *real.parents]
    libs = sorted(real.parent.parent.glob("lib/libpython3*.so*"))
    for lib in libs:
        parts += [lib, *lib.parents]
    for part in parts:
        mode = part.stat().st_mode
        need = stat.S_IXOTH if part.is_dir() else stat.S_IROTH
        if not mode & need:
            return False
    return bool(real.stat().st_mode & stat.S_IXOTH)


def program_python() -> str | None:
    """The interpreter the programs run with: this one where `nobody` may run it (or no user
    switch happens), else the system's Python 3."""
    if not _as_root() or world_runnable(sys.executable):
        return sys.executable
    return next((p for p in SYSTEM_PYTHONS if world_runnable(p)), None)


def unavailable() -> str | None:
    """Why this backend cannot isolate here (None: it can); checked once per process."""
    root = _as_root()
    if root not in _checked:
        if shutil.which("unshare") is None or shutil.which("mount") is None:
            _checked[root] = "`unshare` or `mount` (util-linux) is not installed"
        elif program_python() is None:
            _checked[root] = ("no Python that user nobody can run (this one is under a folder "
                              f"only its owner can enter: {sys.executable})")
        else:
            done = subprocess.run([*unshare_argv(), "true"], capture_output=True, text=True,
                                  timeout=30)
            _checked[root] = None if done.returncode == 0 else (
                f"`unshare` failed: {(done.stderr.strip() or 'exit %d' % done.returncode)[:200]}")
    return _checked[root]


def run(programs: list[str], limits: Limits) -> list[Outcome]:
    body = request(programs, limits, program_python() or sys.executable, isolate=True,
                   separate_user=_as_root())
    budget = len(programs) * (limits.timeout_s + 5) + 60
    # the runner's own interpreter is this one (root inside may read it); -I: no site, no env
    argv = [*unshare_argv(), sys.executable, "-I", str(RUNNER)]
    try:
        done = subprocess.run(argv, input=body, capture_output=True, text=True, timeout=budget,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    except subprocess.TimeoutExpired:
        raise SandboxError(f"the sandbox runner did not finish {len(programs)} programs in "
                           f"{budget:.0f} s") from None
    if done.returncode != 0:
        raise SandboxError(f"the sandbox runner failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-400:]}")
    return parse(done.stdout, len(programs), "process sandbox")
