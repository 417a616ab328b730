"""Symlinks out of a local checkpoint folder: never followed.

A checkpoint is untrusted input. A link inside it whose target lies outside the folder
(``heldout.txt -> /etc/passwd``, a shard linked to a system file) would have day0 read, digest,
evaluate or quote a file the checkpoint's author chose anywhere on this machine. The one layout
that links out on purpose is a snapshot of a blob cache (Hugging Face's, and day0's own for s3
sources: ``<repo>/snapshots/<rev>/<file> -> ../../blobs/<id>``), which stays allowed.
"""

from __future__ import annotations

from pathlib import Path

from day0.errors import InputError


def _allowed_roots(folder: Path) -> list[Path]:
    roots = [folder.resolve()]
    if folder.parent.name == "snapshots":  # a blob cache's snapshot: its blobs are the files
        roots.append((folder.parent.parent / "blobs").resolve())
    return roots


def escaping(folder: str | Path) -> list[str]:
    """Names of the links under folder whose target lies outside it (or its cache's blobs)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    roots = _allowed_roots(folder)
    out = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            target = path.resolve()
            if not any(target == root or root in target.parents for root in roots):
                out.append(str(path.relative_to(folder)))
    return out


def refuse_escaping(folder: str | Path) -> None:
    """InputError (exit 2) naming the first link out of the checkpoint folder; never its
    target's content."""
    found = escaping(folder)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise InputError(f"{found[0]} is a symlink to a file outside the checkpoint folder{more}",
                         file=str(Path(folder) / found[0]), field="symlink",
                         fix="copy the file into the checkpoint folder instead of linking it")


__all__ = ["escaping", "refuse_escaping"]
