"""Where a SOURCE's files come from: a local folder or an s3:// prefix.

* config.json is read by day0.checkpoint.files (``read_config``: for s3 one GET).
* which objects a checkpoint needs and its digest are day0.store.identity's (``wanted_objects``,
  ``listing_digest``): the stage cache key without downloading anything.
* ``local_checkpoint(source)``: a local folder for stages that load weights. For s3 the objects
  are streamed one at a time to ``$DAY0_CACHE_DIR/weights/blobs/<id>`` (id = hash of bucket, key,
  ETag and size; temp file then atomic rename; each GET pinned to the listed ETag with If-Match),
  and ``weights/snapshots/<listing digest>/`` holds symlinks named like the objects. A rerun with
  unchanged ETags downloads nothing; a changed shard downloads only that shard. Blobs stay until
  the cache folder is cleared.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from day0.errors import InputError
from day0.store.identity import cache_dir, listing_digest, wanted_objects
from day0.store.s3 import (ObjectInfo, checkpoint_objects, is_s3, parse_s3_uri, s3_client,
                           translate_error)

# objects below this are one streamed GET; larger ones parallel ranged GETs of PART_BYTES
STREAM_LIMIT = 64 * 2**20
PART_BYTES = 16 * 2**20
CONFIG = "config.json"


def cache_root() -> Path:
    """Where s3 checkpoints are materialized: <day0.store.identity.cache_dir()>/weights."""
    return cache_dir() / "weights"


# --------------------------------------------------------------------------- materialization

@dataclass
class Materialized:
    """A local copy of an s3:// checkpoint and what it cost to get it."""

    path: Path
    source: str
    downloaded_files: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    reused_files: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _blob_id(bucket: str, info: ObjectInfo) -> str:
    return hashlib.sha256(f"{bucket}\n{info.key}\n{info.etag}\n{info.size}".encode()).hexdigest()


class _Pin:
    """s3transfer subscriber: use the listed size and ETag (If-Match on every ranged GET)."""

    def __init__(self, info: ObjectInfo):
        self.info = info

    def on_queued(self, future, **kwargs):
        future.meta.provide_transfer_size(self.info.size)
        if self.info.etag and hasattr(future.meta, "provide_object_etag"):
            future.meta.provide_object_etag(f'"{self.info.etag}"')

    def on_progress(self, future, bytes_transferred, **kwargs):
        pass

    def on_done(self, future, **kwargs):
        pass


def _download(client, bucket: str, info: ObjectInfo, dest: Path) -> None:
    """Stream one object to dest via a temp file in the same folder and an atomic rename."""
    import botocore.exceptions as bx

    where = f"s3://{bucket}/{info.key}"
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the weights from stage containers' own uid
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            if info.size <= STREAM_LIMIT:
                args = {"Bucket": bucket, "Key": info.key}
                if info.etag:
                    args["IfMatch"] = f'"{info.etag}"'
                body = client.get_object(**args)["Body"]
                for chunk in body.iter_chunks(1 << 20):
                    fh.write(chunk)
        if info.size > STREAM_LIMIT:
            from boto3.s3.transfer import TransferConfig, create_transfer_manager

            config = TransferConfig(multipart_threshold=STREAM_LIMIT, multipart_chunksize=PART_BYTES,
                                    max_concurrency=8, max_io_queue=64)
            with create_transfer_manager(client, config) as manager:
                manager.download(bucket, info.key, str(tmp), subscribers=[_Pin(info)]).result()
        got = tmp.stat().st_size
        if got != info.size:
            raise InputError(f"downloaded {got} bytes, the listing says {info.size}", file=where,
                             fix="rerun once the upload has finished")
        os.replace(tmp, dest)
    except (bx.BotoCoreError, bx.ClientError) as exc:
        raise translate_error(exc, where, client) from None
    finally:
        tmp.unlink(missing_ok=True)


def _fetch_blob(client, bucket: str, info: ObjectInfo, blobs: Path) -> bool:
    """Make sure the blob for info exists; True when it had to be downloaded."""
    blob = blobs / _blob_id(bucket, info)
    if blob.is_file() and blob.stat().st_size == info.size:
        return False
    with open(blobs / f".{blob.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching the same blob
        if blob.is_file() and blob.stat().st_size == info.size:
            return False
        _download(client, bucket, info, blob)
    return True


def materialize(source: str, *, client=None, log=None, weights: bool = True) -> Materialized:
    """Local folder with every needed object of an s3:// checkpoint, downloaded shard by shard.
    weights=False: everything but the safetensors shards (config, tokenizer, texts), for a
    stage that reads the shards by ranged GETs (streamed alignment)."""
    started = time.monotonic()
    client = client or s3_client()
    folder, objects = checkpoint_objects(source, client=client)
    objects = wanted_objects(objects)
    if not weights:
        objects = {n: o for n, o in objects.items() if not n.endswith(".safetensors")}
    root = cache_root()
    blobs, snapshots = root / "blobs", root / "snapshots"
    blobs.mkdir(parents=True, exist_ok=True)
    snapshots.mkdir(parents=True, exist_ok=True)
    done = Materialized(path=snapshots / listing_digest(objects)[:32], source=str(parse_s3_uri(source)))
    for name, info in sorted(objects.items()):
        if _fetch_blob(client, folder.bucket, info, blobs):
            done.downloaded_files.append(name)
            done.downloaded_bytes += info.size
            if log:
                log(f"downloaded {name} ({info.size} bytes)")
        else:
            done.reused_files.append(name)
    if not done.path.is_dir():
        _link_snapshot(done.path, folder.bucket, objects)
    done.seconds = time.monotonic() - started
    return done


def _link_snapshot(path: Path, bucket: str, objects: dict[str, ObjectInfo]) -> None:
    """Build the snapshot folder of symlinks aside and rename it into place (atomic)."""
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    tmp.chmod(0o755)  # readable by stage containers running as another uid
    try:
        for name, info in objects.items():
            (tmp / name).symlink_to(Path("..") / ".." / "blobs" / _blob_id(bucket, info))
        (tmp / ".day0-source.json").write_text(json.dumps(
            {"bucket": bucket, "objects": {n: [o.key, o.etag, o.size] for n, o in objects.items()}},
            indent=1))
        try:
            os.rename(tmp, path)
        except OSError:  # another process made the same snapshot first
            if not path.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def local_checkpoint(source: str, *, log=None, weights: bool = True) -> str:
    """source itself when local; the materialized snapshot folder for s3:// (safe to call from
    several threads or processes at once: blobs are fetched under a file lock, the snapshot
    folder is renamed into place). weights=False leaves the shards on the store."""
    if not is_s3(source):
        return source
    from day0.store.retry import retrying

    # a store that cannot answer now is asked again (store.yaml reads), then StoreDown: never
    # an input error about the checkpoint; what was downloaded before is reused
    return str(retrying(lambda: materialize(source, log=log, weights=weights), source,
                        log=log).path)


__all__ = ["Materialized", "materialize", "local_checkpoint", "cache_root",
           "STREAM_LIMIT"]
