"""Sealed evidence: what a run stores for later runs to replay instead of recomputing (the
alignment reference bank, stored evaluation reference results, stored reference scores) is
replayed only when its seal verifies.

A seal is an HMAC-SHA256 over the record's canonical JSON, which names the digest of every file
the record covers. The key is $DAY0_EVIDENCE_SECRET when set: every side that validates against
a shared results store sets the same secret, so what one stored another can replay, and anyone
who can write results but does not hold the secret cannot forge evidence. Without it, a key made
once per machine under day0's cache dir (mode 0600): evidence this machine stored is replayed
here, evidence from elsewhere is recomputed. Whoever replays says so, and from which record.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

ENV = "DAY0_EVIDENCE_SECRET"
FIELD = "seal"
CHUNK = 1 << 20


def _key() -> bytes:
    shared = os.environ.get(ENV)
    if shared:
        return shared.encode()
    from day0.store.identity import cache_dir

    path = cache_dir() / "evidence.key"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        made = path.with_name(f".evidence.key.{os.getpid()}")
        fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32))
        try:  # another process may have made one meanwhile: the first one stays
            os.link(made, path)
        except FileExistsError:
            pass
        finally:
            made.unlink()
    return path.read_text().strip().encode()


def keyed_by() -> str:
    """Whose key seals and verifies here: 'shared secret' or 'this machine's key'."""
    return "shared secret" if os.environ.get(ENV) else "this machine's key"


def _canonical(record: dict) -> bytes:
    body = {k: v for k, v in record.items() if k != FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def seal(record: dict) -> dict:
    """The record with its seal."""
    return {**record, FIELD: hmac.new(_key(), _canonical(record), hashlib.sha256).hexdigest()}


def broken(record: dict) -> str | None:
    """Why the record's seal does not verify (unsealed, or sealed with another key or over
    other content), or None when it does."""
    found = record.get(FIELD) if isinstance(record, dict) else None
    if not isinstance(found, str):
        return f"it is not sealed (set {ENV} alike where it was stored and here)"
    expected = hmac.new(_key(), _canonical(record), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(found, expected):
        return (f"its seal does not verify with {keyed_by()}: changed since it was stored, or "
                f"stored with another key ({ENV})")
    return None


def file_digest(path: str | Path) -> str:
    """sha256 of a local file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def bytes_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


__all__ = ["ENV", "seal", "broken", "keyed_by", "file_digest", "bytes_digest"]
