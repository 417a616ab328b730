"""Without weights: the parameters of transformers' class, counted in a child process.

Exact counts of a bare config.json need the class (tied weights once, fused experts, the biases a
config implies), and building it needs torch, which header-only analysis never imports. So
:func:`meta_parameters` runs ``python -m day0.torchkit.metaparams`` (the class on the meta device:
no memory) within a timeout, forked from the warm stage host when one is there (day0.execution.stagehost:
transformers imported already) or started cold, and reads the parameters' names and shapes from
its JSON answer. A
config transformers refuses comes back as the child's own InputError (same text as before the
split); a crash or a timeout is one InputError naming config.json. Never a traceback or a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import day0
from day0 import errors
from day0.execution import lifecycle, stagehost
from day0.errors import InputError, Problem, shorten

MODULE = "day0.torchkit.metaparams"
BUILD_FIX = "correct the field the error names (compare with the model's release)"


def meta_parameters(view, *, trust_remote_code: bool, timeout_s: float
                    ) -> tuple[list[tuple[str, tuple[int, ...]]], str]:
    """((name, shape) of every parameter of the class for view.raw, the class's name)."""
    request = json.dumps({"config": view.raw, "file": view.file,
                          "trust_remote_code": trust_remote_code})
    try:  # the host's key is this environment's: the host that serves this process's stages
        code, stdout, said = _hosted(request, dict(os.environ), timeout_s)
    except stagehost.HostUnavailable:
        # a cold child imports this day0, wherever the parent found it
        root = str(Path(day0.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        try:
            proc = subprocess.run([sys.executable, "-m", MODULE], input=request, text=True,
                                  capture_output=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            code = None
        else:
            code, stdout = proc.returncode, proc.stdout
            said = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if code is None:
        raise InputError(f"transformers did not build {view.class_name} on the meta device "
                         f"within {timeout_s:g} s (to count its parameters)", file=view.file,
                         fix="raise analysis.count_timeout_s, or analyse the checkpoint with its "
                             "weights (header counts need no model)")
    doc = _answer(stdout)
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        raise _error(doc["error"], view.file)
    if code != 0 or not isinstance(doc, dict) or "parameters" not in doc:
        raise InputError(f"transformers cannot build {view.class_name} from it: the child "
                         f"counting its parameters exited {code}: {shorten(said, 200)}",
                         file=view.file, fix=BUILD_FIX)
    return [(str(n), tuple(int(d) for d in s)) for n, s in doc["parameters"]], str(doc["class"])


def _hosted(request: str, env: dict[str, str], timeout_s: float) -> tuple[int | None, str, str]:
    """(exit code or None on timeout, stdout, its last non-JSON line) of the child forked from
    the warm stage host, which has transformers imported already (seconds saved per config);
    HostUnavailable when there is none to fork from (then the caller starts it cold)."""
    if not stagehost.enabled():
        raise stagehost.HostUnavailable("the warm stage host is off")
    env = {**env, lifecycle.OWNER_ENV: lifecycle.owner_token()}
    with tempfile.TemporaryDirectory(prefix="day0-metaparams-") as folder:
        path = Path(folder) / "request.json"
        path.write_text(request, encoding="utf-8")
        child = stagehost.host_for(env).spawn(f"{MODULE}:main", [str(path)], env, os.getcwd())
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(child.stdout.read()), daemon=True)
        reader.start()  # a big model's answer is megabytes: read while it writes
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            lifecycle.kill_group(child.pid)
            code = None
        reader.join(timeout=10)
        child.stdout.close()
    stdout = "".join(chunks)
    lines = [line for line in stdout.strip().splitlines() if not line.startswith("{")]
    return code, stdout, (lines or ["no output"])[-1]


def _answer(stdout: str):
    """The last line of stdout as JSON (anything a library printed before it is ignored)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def _error(error: dict, file: str) -> InputError:
    """The child's Day0Error, as the same class when it is an InputError kind."""
    kind = getattr(errors, str(error.get("type")), InputError)
    if not (isinstance(kind, type) and issubclass(kind, InputError)):
        kind = InputError
    problems = [Problem(**{k: p.get(k) for k in ("message", "file", "field", "fix")})
                for p in error.get("problems") or [] if isinstance(p, dict) and p.get("message")]
    return kind.from_problems(problems or [Problem("transformers refuses this config", file=file,
                                                   fix=BUILD_FIX)])


__all__ = ["meta_parameters", "MODULE"]
