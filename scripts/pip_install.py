"""`pip install ARGS` into a venv, through uv when it can: the same resolution, ~10x faster.

Usage: python scripts/pip_install.py VENV_PYTHON [pip install arguments...]

pip spends minutes of CPU on a fresh venv here (3 min 45 s for day0 and its test extras, most of
it reading the extra file:// indexes); `uv pip install` resolves and installs the same set in
about 20 s, which `make test`, `make demo` and `make engine` pay on every clean machine. uv does
not read pip's configuration, so the indexes, find-links, constraints and CA bundle pip is
configured with (`pip config list`, PIP_* variables included) are passed to it, and
`unsafe-best-match` picks across indexes as pip does (the local CPU torch wheel included).
Whatever goes wrong on the uv path (uv not installable, an index it cannot read, a resolution
it refuses), the same arguments go to pip itself: never worse than before, only slower.
DAY0_NO_UV=1 skips uv.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

UV = "uv==0.13.9"
# pip config key -> the uv flag taking each of its (space-separated) values
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}


def pip_config(python: str) -> dict[str, list[str]]:
    """pip's effective settings: `scope.key='value'` lines, environment (:env:) included."""
    done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                          text=True, timeout=60)
    settings: dict[str, list[str]] = {}
    from_env: set[str] = set()
    for line in done.stdout.splitlines():
        name, sep, value = line.partition("=")
        key = name.rsplit(".", 1)[-1]
        if sep and (key not in from_env or name.startswith(":env:")):  # PIP_* wins, as in pip
            settings[key] = shlex.split(value.strip().strip("'\""))
            if name.startswith(":env:"):
                from_env.add(key)
    return settings


def uv_command(python: str, args: list[str]) -> tuple[list[str], dict[str, str]] | None:
    uv = os.path.join(os.path.dirname(python), "uv")
    if not os.path.exists(uv):
        got = subprocess.run([python, "-m", "pip", "install", "--quiet", UV],
                             capture_output=True, text=True, timeout=300)
        if got.returncode or not os.path.exists(uv):
            return None
    settings = pip_config(python)
    # --compile-bytecode: pip writes .pyc at install time, uv does not by default; without them
    # every fresh process (PYTHONDONTWRITEBYTECODE set, or a read-only image) compiles the stack
    argv = [uv, "pip", "install", "--python", python, "--index-strategy", "unsafe-best-match",
            "--compile-bytecode"]
    given = " ".join(args)
    for key, flag in FLAGS.items():
        if key == "index-url" and ("--index-url" in given or "--no-index" in given):
            continue  # the command's own index wins, as with pip
        for value in settings.get(key, []):
            argv += [flag, value]
    env = dict(os.environ)
    cert = settings.get("cert")
    if cert and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = cert[0]
    return argv + args, env


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    python, args = argv[0], argv[1:]
    if os.environ.get("DAY0_NO_UV") != "1" and (command := uv_command(python, args)):
        cmd, env = command
        if subprocess.run(cmd, env=env).returncode == 0:
            return 0
        print("pip_install: uv failed; installing with pip instead", file=sys.stderr)
    return subprocess.run([python, "-m", "pip", "install", *args]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
