"""One checkpoint, one identity: model name, revision, weights digest, results location.

Every entry path (an object-store upload seen by the receiver, a signed release webhook,
``prefect deployment run 'validate/...' -p source=...``, ``day0 validate SOURCE``) names a
checkpoint through this module, so the same weights get the same name everywhere:

* **model**: the release's own name when it gives one; else an s3:// source's key prefix
  WITHOUT the bucket (``s3://models/acme/tiny-llama`` -> ``acme/tiny-llama``; a bare bucket is
  its own name), or a local folder's name. When a revision is given and the s3 key ends with it
  as a segment (Hugging Face style ``org/name/<rev>``), that segment is dropped: the results path
  holds the revision once.
* **revision**: the release's revision when given; else ONE digest form, ``REVISION_HEX`` hex
  digits: for s3 the listing digest of the wanted objects (names, ETags, sizes; one LIST, no
  data read), for a local folder the content digest (xxh3-128 of every byte). The receiver
  computes it from its completeness listing with the same function (``listing_revision``).
* **weights digest**: the full digest the revision is cut from; it keys the stage cache
  (``weights_key``).
* **results**: ``<base>/<model>/<revision>/<target>/runs/<run-id>/`` (report.json, report.md,
  stages/*.json; report.json written last) - every run is kept, never overwritten - and
  ``<base>/<model>/<revision>/<target>/latest.json`` = ``{"run_id", "uri", "created_at"}``
  naming the newest run; it is only replaced by a run whose id sorts after the one it names (run
  ids start with their UTC time, ``new_run_id``), so a run published late (day0.store.outbox)
  never takes it back from a newer one. base: the given results URI, else
  ``$DAY0_RESULTS_URI``, else ``s3://<source bucket>/day0-results`` for an s3 source; a local
  source without either is not published. base may be s3:// or a local folder.

**Dedupe** (the receiver): ``dedupe_key(model, revision, target)`` =
``day0:<model>@<revision>:<target>`` names one release on one target. Redeliveries, and an
upload plus a webhook of the same release, are merged while that release's run is pending or
running; once the run has finished, a new announcement starts a new run, kept next to the first.
Prefect keeps an idempotency key for good (the same key returns the old, finished run), so the
n-th run of one release is submitted as ``dedupe_key(..., seq=n)`` = ``<key>#<n>`` (the first
keeps the bare key): a resubmission after a crash reuses its row's key and never doubles a run.
The receiver's journal (day0.receiver.journal) holds the sequence and the run's state.

Torch-free by contract: the receiver imports this module. It imports only day0.store.s3,
day0.errors, day0.atomic, xxhash and the standard library (never day0.execution.cache, day0.store.sources, ...).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from day0.atomic import write_atomic
from day0.errors import Day0Error, InputError
from day0.store.s3 import (ObjectInfo, S3Uri, checkpoint_objects, head_object, is_s3, parse_s3_uri,
                           put_object, read_object, safe_segment, write_results)

RESULTS_FOLDER = "day0-results"
REVISION_HEX = 16
CONFIG = "config.json"
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
LATEST = "latest.json"
UNREADABLE = "unreadable"  # revision of a run whose source could not be read (publish only)
_RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$")


def cache_dir() -> Path:
    """day0's cache folder: $DAY0_CACHE_DIR, default ~/.cache/day0 (read here only)."""
    root = os.environ.get("DAY0_CACHE_DIR") or Path.home() / ".cache" / "day0"
    return Path(root)


# --------------------------------------------------------------------------- digests

def file_digest(path: Path) -> str:
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


def wanted_objects(objects: dict[str, ObjectInfo]) -> dict[str, ObjectInfo]:
    """The files a stage needs: everything under the prefix, except other weight formats
    (pytorch .bin etc.) when safetensors are present (HF repos often ship both)."""
    if not any(n.endswith(".safetensors") for n in objects):
        return dict(objects)
    return {n: o for n, o in objects.items() if not n.endswith(OTHER_WEIGHTS)}


def listing_digest(objects: dict[str, ObjectInfo]) -> str:
    """sha256 over (name, ETag, size) of each object: the checkpoint's identity on the store."""
    h = hashlib.sha256(b"s3-objects\n")
    for name, info in sorted(objects.items()):
        h.update(f"{name}:{info.etag}:{info.size}\n".encode())
    return h.hexdigest()


def short(digest: str) -> str:
    """The revision form of a full digest: its first REVISION_HEX hex digits."""
    return digest.rsplit(":", 1)[-1][:REVISION_HEX]


def listing_revision(objects: dict[str, ObjectInfo]) -> str:
    """The revision of the objects directly under a prefix (what a manual run of it computes)."""
    return short(listing_digest(wanted_objects(objects)))


def s3_weights_digest(source: str) -> str:
    """Digest of an s3:// checkpoint from one LIST (keys, ETags, sizes); no data is read."""
    _, objects = checkpoint_objects(source)
    return listing_digest(wanted_objects(objects))


def loader_files(folder: Path) -> set[str]:
    """The files of a checkpoint folder a loader reads (day0/data/digest.yaml), as paths
    relative to it; the rest are listed, not read."""
    from day0 import DATA_DIR
    from day0.yamlio import read_mapping

    rules = read_mapping(DATA_DIR / "digest.yaml")
    top = {p.name for p in folder.iterdir() if p.is_file()}
    read = {n for n in top if n in rules["hashed_names"]
            or n.endswith(tuple(rules["hashed_suffixes"]))}
    for index in (n for n in rules["indexes"] if n in top):
        read.add(index)
        try:
            named = json.loads((folder / index).read_text())["weight_map"].values()
            read |= {str(n) for n in named if isinstance(n, str) and (folder / n).is_file()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            read |= {n for n in top if n.endswith(tuple(rules["weight_suffixes"]))}
        return read
    for suffix in rules["weight_suffixes"]:
        weights = {n for n in top if n.endswith(suffix)}
        if weights:
            return read | weights
    return read


def local_weights_digest(source: str | Path) -> str:
    """Digest of a checkpoint folder (or a lone file): the content of every file a loader reads
    (:func:`loader_files`), and the name and size of every other file (listed, not read)."""
    path = Path(source)
    if not path.exists():
        raise InputError("no such file or folder", file=str(source),
                         fix="pass a checkpoint folder, its config.json or s3://BUCKET/PREFIX")
    h = hashlib.sha256()
    if not path.is_dir():
        h.update(f"{path.name}:{file_digest(path)}\n".encode())
        return h.hexdigest()
    from day0.store.links import refuse_escaping

    refuse_escaping(path)  # a link out of the checkpoint is never read, nor digested
    read = loader_files(path)
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = str(f.relative_to(path))
        h.update((f"{rel}:{file_digest(f)}\n" if rel in read
                  else f"{rel}:listed:{f.stat().st_size}\n").encode())
    return h.hexdigest()


def weights_digest(source: str) -> str:
    """Full digest of a checkpoint: s3 listing digest, or local content digest."""
    return s3_weights_digest(source) if is_s3(source) else local_weights_digest(source)


def weights_key(source: str) -> str:
    """The weights part of a stage cache key: computed once per validation, shared by its stages.
    A store that cannot be listed now gets a random key (never reuse a result; the stage reports
    why); a local path that does not exist is keyed by itself."""
    if is_s3(source):
        try:
            return weights_digest(source)
        except Day0Error:
            return f"unlisted:{os.urandom(16).hex()}"
    return weights_digest(source) if Path(source).exists() else str(source)


# --------------------------------------------------------------------------- names

def _segments(name: str) -> list[str]:
    return [p for p in str(name).split("/") if p]


def model_name(source: str, revision: str | None = None) -> str:
    """The model a source holds: the s3 key prefix without the bucket (a trailing config.json
    and - when it equals `revision` - a trailing revision segment dropped), or a local folder's
    name."""
    if is_s3(source):
        u = parse_s3_uri(source)
        parts = _segments(u.key)
        if parts and parts[-1] == CONFIG:
            parts.pop()
        if revision and len(parts) > 1 and parts[-1] == revision:
            parts.pop()  # HF style org/name/<rev>: the revision names the folder once
        return "/".join(parts) or u.bucket
    path = Path(source)
    return (path.parent if path.is_file() else path).resolve().name or "model"


def default_revision(source: str) -> str:
    """The revision of a source that names none: REVISION_HEX hex digits of its weights digest,
    or UNREADABLE when the source cannot be read."""
    return resolve(source, strict=False).revision


def dedupe_key(model: str, revision: str, target: str, seq: int = 1) -> str:
    """``day0:<model>@<revision>:<target>`` names one release on one target; the n-th run of it
    (n > 1, after the earlier ones finished) is ``<key>#<n>`` (Prefect keeps keys for good)."""
    key = f"day0:{model}@{revision}:{target}"
    return key if seq <= 1 else f"{key}#{seq}"


@dataclass(frozen=True)
class Identity:
    """What one checkpoint is called, wherever its run was started."""

    model: str
    revision: str
    weights_digest: str | None  # None only for an unreadable source (resolve(strict=False))
    revision_given: bool

    def dedupe_key(self, target: str, seq: int = 1) -> str:
        return dedupe_key(self.model, self.revision, target, seq)

    def parts(self, target: str) -> list[str]:
        """Path segments <model...>/<revision>/<target> under a results base."""
        return [*map(safe_segment, _segments(self.model)), safe_segment(self.revision),
                safe_segment(target)]


def resolve(source: str, model: str | None = None, revision: str | None = None, *,
            weights: str | None = None, strict: bool = True) -> Identity:
    """The identity of the checkpoint at `source`; model and revision as a release gives them.

    weights: weights_key(source) when the caller already has it (saves a LIST, or reading every
    byte of a local folder). An unreadable source is an InputError, or with strict=False the
    revision UNREADABLE (when none was given) and no weights digest."""
    model = "/".join(_segments(model)) if model else None
    revision = revision or None
    digest = weights if weights and not weights.startswith("unlisted:") and weights != source else None
    if digest is None:
        try:
            digest = weights_digest(source)
        except Day0Error:
            if strict:
                raise
    return Identity(model=model or model_name(source, revision),
                    revision=revision or (short(digest) if digest else UNREADABLE),
                    weights_digest=digest, revision_given=revision is not None)


# --------------------------------------------------------------------------- results

def results_base(source: str, results_uri: str | None = None) -> str | None:
    """Where results of `source` go: results_uri, $DAY0_RESULTS_URI, s3://<bucket>/day0-results
    for an s3 source; None for a local source without either."""
    base = results_uri or os.environ.get("DAY0_RESULTS_URI")
    if base:
        return base
    if is_s3(source):
        return str(S3Uri(parse_s3_uri(source).bucket, RESULTS_FOLDER))
    return None


def _join(base: str, parts: list[str]) -> str:
    if is_s3(base):
        u = parse_s3_uri(base)
        return str(S3Uri(u.bucket, "/".join([u.key, *parts] if u.key else parts))) + "/"
    return str(Path(base).joinpath(*parts)) + "/"


def results_location(results_uri: str | None, source: str, target_name: str,
                     revision: str | None = None, model: str | None = None, *,
                     weights: str | None = None) -> str | None:
    """``<base>/<model>/<revision>/<target>/`` (ends in '/'), or None when nothing is published.
    Runs go under its runs/<run-id>/, latest.json next to runs/."""
    base = results_base(source, results_uri)
    if base is None:
        return None
    if revision:  # named by the release: no need to list or read the weights
        ident = Identity("/".join(_segments(model)) if model else model_name(source, revision),
                         revision, weights, True)
    else:
        ident = resolve(source, model, weights=weights, strict=False)
    return _join(base, ident.parts(target_name))


def run_location(folder: str, run_id: str) -> str:
    """A run's folder under a results_location: ``<folder>runs/<run_id>/``."""
    return _join(folder, ["runs", run_id])


def new_run_id(flow_run_id: str | None = None, now: dt.datetime | None = None) -> str:
    """``20261130T201502Z-<8 hex>``: UTC time first, so ids sort by time; then the first 8 hex of
    the flow run id (random when there is none)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    tail = re.sub(r"[^0-9a-f]", "", str(flow_run_id or "").lower())[:8]
    if len(tail) < 8:
        tail = uuid.uuid4().hex[:8]
    return f"{now.astimezone(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{tail}"


def _read(uri: str) -> bytes | None:
    """Bytes of an s3 object or local file; None when it does not exist."""
    if is_s3(uri):
        return read_object(uri) if head_object(uri) is not None else None
    try:
        return Path(uri).read_bytes()
    except FileNotFoundError:
        return None


def _parse_latest(raw: bytes | None) -> dict | None:
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:  # a damaged pointer is replaced by the next run
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("run_id"), str) else None


def _newer(run_id: str, current: dict | None) -> bool:
    return current is None or run_id > current["run_id"]


def _point_latest(folder: str, run_id: str, run_uri: str) -> bool:
    """Make folder/latest.json name run_id unless it names a later run; True when written.

    Local: read-compare-replace under an flock (exact). s3 has no lock: read, compare, put - a
    publisher of an older run racing between another's read and put may win; the runs/ folder
    stays the record either way."""
    doc = json.dumps({"run_id": run_id, "uri": run_uri,
                      "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")},
                     indent=1).encode()
    where = folder + LATEST
    if is_s3(folder):
        if not _newer(run_id, _parse_latest(_read(where))):
            return False
        put_object(where, doc)
        return True
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / ".latest.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _newer(run_id, _parse_latest(_read(where))):
            return False
        write_atomic(where, doc)
    return True


def publish_run(files: dict[str, bytes], *, source: str, target_name: str,
                model: str | None = None, revision: str | None = None, run_id: str,
                results_uri: str | None = None, weights: str | None = None,
                resume: bool = False, point_latest: bool = True) -> str | None:
    """Write one run's files to ``<base>/<model>/<revision>/<target>/runs/<run_id>/``
    (report.json last: a run folder holding it is whole) and point latest.json at it when it is
    the newest; returns the run folder URI (ends in '/'), or None when there is nowhere to
    publish (local source, no results URI). A run already published under run_id is never
    overwritten (InputError), except with resume, for this same run again (a retry, an outbox
    drain after a partial attempt): its report.json, when there, is byte for byte this one's.
    Store failures are InputErrors (Unreachable when the store could not answer). Without
    point_latest (a partial or interrupted run: evidence, not the release's verdict) the run
    folder is written and latest.json left as it is."""
    if not _RUN_ID.match(run_id):
        raise InputError(f"run id {run_id!r} is not <UTC time>-<8 hex>", field="run_id",
                         fix="make it with day0.store.identity.new_run_id")
    folder = results_location(results_uri, source, target_name, revision, model, weights=weights)
    if folder is None:
        return None
    run_uri = run_location(folder, run_id)
    there = _read(run_uri + "report.json")
    ours = resume and there in (None, files.get("report.json"))
    if (there is not None or (not is_s3(run_uri) and Path(run_uri).exists())) and not ours:
        raise InputError("a run with this id is already published", file=run_uri,
                         fix="give every run its own id (day0.store.identity.new_run_id)")
    write_results(run_uri, {**{k: v for k, v in files.items() if k != "report.json"},
                            **({"report.json": files["report.json"]} if "report.json" in files
                               else {})})
    if point_latest:
        _point_latest(folder, run_id, run_uri)
    return run_uri


def read_latest(*, source: str, target_name: str, model: str | None = None,
                revision: str | None = None, results_uri: str | None = None) -> dict | None:
    """latest.json of a model/revision/target ({"run_id", "uri", "created_at"}), or None."""
    folder = results_location(results_uri, source, target_name, revision, model)
    return _parse_latest(_read(folder + LATEST)) if folder else None


__all__ = ["Identity", "resolve", "model_name", "dedupe_key", "cache_dir", "file_digest",
           "wanted_objects", "listing_digest", "listing_revision", "short", "weights_digest",
           "s3_weights_digest", "local_weights_digest", "weights_key", "safe_segment",
           "results_base", "results_location", "run_location", "default_revision", "new_run_id", "publish_run", "read_latest",
           "RESULTS_FOLDER", "REVISION_HEX", "UNREADABLE"]
