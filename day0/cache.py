"""Stage result cache keyed by (weights digest, target, stage config, revision, code version).

A repeated validation with nothing changed reuses every stage's outcome. Any change to the
checkpoint's files (their content, hashed on every run), the target profile (plugins' source
included), the stage config, the upstream results, the revision or day0's own code or data gives
a new key. Only successful outcomes are stored.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from day0.atomic import write_atomic
from day0.stage import StageOutcome, StageSpec

PACKAGE = Path(__file__).parent


def cache_dir() -> Path:
    root = os.environ.get("DAY0_CACHE_DIR") or Path.home() / ".cache" / "day0"
    return Path(root)


def _file_digest(path: Path) -> str:
    """xxh3-128 of the file's full bytes, computed every time: an in-place edit that restores the
    mtime cannot reuse stale results (a (path, size, mtime) memo could). Read into one reused
    buffer; not mmap, whose pages raise SIGBUS, killing the flow, if the file shrinks meanwhile.
    bench/bench_digest.py measures it: the disk is the limit."""
    import xxhash

    h = xxhash.xxh3_128()
    buf = bytearray(1 << 24)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
    return f"xxh3_128:{h.hexdigest()}"


def weights_digest(source: str) -> str:
    """Digest of the content of every file of a checkpoint folder (or of a lone config.json);
    for s3:// the objects' names, ETags and sizes from one listing (nothing downloaded)."""
    if str(source).startswith("s3://"):
        from day0.sources import weights_digest as s3_digest

        return s3_digest(source)
    path = Path(source)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        rel = f.relative_to(path) if path.is_dir() else f.name
        h.update(f"{rel}:{_file_digest(f)}\n".encode())
    return h.hexdigest()


@lru_cache(maxsize=1)
def code_version() -> str:
    """Digest of day0's source and data files: editing the engine invalidates cached results."""
    h = hashlib.sha256()
    for f in sorted(PACKAGE.rglob("*")):
        if f.suffix in {".py", ".yaml", ".txt"} and "__pycache__" not in f.parts:
            h.update(f"{f.relative_to(PACKAGE)}:".encode() + f.read_bytes())
    return h.hexdigest()


def _plugin_sources(plugins: list[str]) -> list[str]:
    """Content digests of file plugins (module plugins are keyed by name and version of day0)."""
    out = []
    for spec in plugins:
        p = Path(spec)
        out.append(_file_digest(p) if p.is_file() else spec)
    return out


def weights_key(source: str) -> str:
    """The weights part of a stage key: computed once per validation, shared by its stages."""
    if str(source).startswith("s3://"):
        from day0.errors import Day0Error

        try:
            return weights_digest(source)
        except Day0Error:  # store unreachable now: never reuse a result; the stage reports why
            return f"unlisted:{os.urandom(16).hex()}"
    return weights_digest(source) if Path(source).exists() else source


def stage_key(spec: StageSpec, weights: str | None = None) -> str:
    """weights: weights_key(source) when the caller already has it (one LIST per run on s3)."""
    inputs = spec.inputs
    material = {
        "stage": spec.stage,
        "config": spec.config,
        "weights": weights or weights_key(inputs.source),
        "target": inputs.target.model_dump(mode="json"),
        "plugins": _plugin_sources(inputs.target.plugins),
        "reference": inputs.reference.model_dump(mode="json"),
        "upstream": inputs.upstream,
        "trust_remote_code": inputs.trust_remote_code,
        # the alignment stage compares with (and stores) the score of this model and revision:
        # a result cached under another revision never did that for this one
        "revision": inputs.revision,
        "code": code_version(),
    }
    if inputs.target.runner == "docker":  # the image is the target's software stack
        from day0.runners.docker import image_id

        material["image"] = image_id(inputs.target.container.image)
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def load(key: str) -> StageOutcome | None:
    path = cache_dir() / "stages" / f"{key}.json"
    if not path.is_file():
        return None
    try:
        outcome = StageOutcome.model_validate_json(path.read_text())
    except ValueError:  # a damaged entry is a miss, never an error
        return None
    return outcome.model_copy(update={"cached": True})


def store(key: str, outcome: StageOutcome) -> None:
    if not outcome.ok:
        return
    # the cache dir may be shared: never write through a guessable temp name (day0.atomic)
    write_atomic(cache_dir() / "stages" / f"{key}.json", outcome.model_dump_json())
