"""Atomic file writes through an unpredictable temporary name.

A temp name like ``<key>.<pid>.tmp`` can be guessed: in a shared folder (a cache dir, a results
folder) another user can plant a symlink there and redirect the write. ``tempfile.mkstemp``
creates the file with ``O_CREAT | O_EXCL`` (a planted name is never followed) under a random name
in the destination's own folder, so ``os.replace`` stays an atomic rename on one filesystem.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes, mode: int = 0o644) -> Path:
    """Write data to path so that readers see the old file or the whole new one, never a part.

    mode: permissions of the result (mkstemp's 0600 would hide it from other readers, e.g. a
    stage container running as another uid)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


__all__ = ["write_atomic"]
