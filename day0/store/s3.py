"""Object-store access: s3:// URIs, the boto3 client, listings, ranged reads, uploads.

Any S3-compatible store works: AWS S3, MinIO, Ceph RGW, SeaweedFS. The client takes the usual
AWS settings (environment, profiles, instance roles; ``AWS_ENDPOINT_URL`` too) and these
overrides:

=====================  =========================================================================
DAY0_S3_ENDPOINT       endpoint URL, e.g. ``http://minio:9000`` (MinIO/Ceph/SeaweedFS)
DAY0_S3_REGION         region (default: AWS settings, else us-east-1)
DAY0_S3_ACCESS_KEY     access key id (with DAY0_S3_SECRET_KEY; else the AWS credential chain)
DAY0_S3_SECRET_KEY     secret access key
DAY0_S3_ADDRESSING     ``path`` or ``virtual``; default ``path`` when an endpoint is set
DAY0_S3_ANONYMOUS      ``1``: unsigned requests (public buckets)
DAY0_S3_CONNECT_TIMEOUT  seconds to connect (default 3); with 3 attempts a dead endpoint fails
                         in seconds
=====================  =========================================================================

Every failure becomes an :class:`~day0.errors.InputError` whose ``file`` is the s3:// URI and whose
``fix`` says what to change (missing bucket or prefix, no credentials, endpoint unreachable,
access denied); a store that could not answer now (refused, timed out, 5xx) is an
:class:`Unreachable`, which day0.store.retry asks again for a bounded time. A checkpoint "folder"
is the set of objects directly under a prefix.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from day0.atomic import write_atomic
from day0.errors import InputError

SCHEME = "s3://"
# first ranged GET of a shard: the 8-byte length and, for most shards, the whole header
HEADER_PROBE_BYTES = 64 * 1024
PREFETCH_THREADS = 8
CREDENTIALS_FIX = ("set DAY0_S3_ACCESS_KEY and DAY0_S3_SECRET_KEY (or AWS_ACCESS_KEY_ID/"
                   "AWS_SECRET_ACCESS_KEY or AWS_PROFILE), or DAY0_S3_ANONYMOUS=1 for a public bucket")


def is_s3(source) -> bool:
    return str(source).startswith(SCHEME)


@dataclass(frozen=True)
class S3Uri:
    """s3://bucket/key-or-prefix, with no leading or trailing slash on the key."""

    bucket: str
    key: str = ""

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def child(self, name: str) -> "S3Uri":
        return S3Uri(self.bucket, f"{self.key}/{name}" if self.key else name)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "S3Uri":
        return S3Uri(self.bucket, self.key.rsplit("/", 1)[0] if "/" in self.key else "")


def parse_s3_uri(uri: str | S3Uri) -> S3Uri:
    """S3Uri of 's3://bucket/prefix'; InputError for anything else."""
    if isinstance(uri, S3Uri):
        return uri
    text = str(uri)
    if not is_s3(text) or not text[len(SCHEME):].split("/", 1)[0]:
        raise InputError("not an s3:// URI", file=text, fix="write it as s3://BUCKET/PREFIX")
    bucket, _, key = text[len(SCHEME):].partition("/")
    return S3Uri(bucket, key.strip("/"))


# --------------------------------------------------------------------------- client

def client_settings() -> dict:
    """The DAY0_S3_* overrides in effect (what s3_client() is built from)."""
    env = os.environ
    endpoint = env.get("DAY0_S3_ENDPOINT") or None
    addressing = env.get("DAY0_S3_ADDRESSING") or ("path" if endpoint else None)
    if addressing not in (None, "path", "virtual", "auto"):
        raise InputError(f"DAY0_S3_ADDRESSING={addressing!r}", field="DAY0_S3_ADDRESSING",
                         fix="use 'path' or 'virtual'")
    try:
        connect_timeout = float(env.get("DAY0_S3_CONNECT_TIMEOUT") or 3)
    except ValueError:
        raise InputError(f"DAY0_S3_CONNECT_TIMEOUT={env['DAY0_S3_CONNECT_TIMEOUT']!r}",
                         field="DAY0_S3_CONNECT_TIMEOUT", fix="give seconds, e.g. 3") from None
    return {"endpoint": endpoint, "region": env.get("DAY0_S3_REGION") or None,
            "access_key": env.get("DAY0_S3_ACCESS_KEY") or None,
            "secret_key": env.get("DAY0_S3_SECRET_KEY") or None,
            "addressing": addressing, "anonymous": env.get("DAY0_S3_ANONYMOUS", "") in ("1", "true"),
            "connect_timeout": connect_timeout}


def s3_client(**overrides):
    """A boto3 S3 client from the AWS settings plus DAY0_S3_* overrides (cached per settings);
    keyword overrides that are not None (endpoint, region, access_key, secret_key,
    connect_timeout, read_timeout, max_attempts) win."""
    settings = client_settings()
    settings.update({k: v for k, v in overrides.items() if v is not None})
    if overrides.get("endpoint") and not os.environ.get("DAY0_S3_ADDRESSING"):
        settings["addressing"] = "path"  # as for DAY0_S3_ENDPOINT: MinIO/Ceph by host name
    return _client(tuple(sorted(settings.items())))


@lru_cache(maxsize=8)
def _client(settings: tuple):
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    s = dict(settings)
    session = boto3.session.Session()
    region = s["region"] or session.region_name or "us-east-1"
    # a caller that must fail fast (the receiver's store checks) bounds reads and attempts
    retries = ({"total_max_attempts": s["max_attempts"]} if s.get("max_attempts") else
               {"max_attempts": 3})
    config = Config(connect_timeout=s["connect_timeout"], read_timeout=s.get("read_timeout") or 30,
                    retries={**retries, "mode": "standard"},
                    s3={"addressing_style": s["addressing"]} if s["addressing"] else None,
                    signature_version=UNSIGNED if s["anonymous"] else None,
                    max_pool_connections=max(10, PREFETCH_THREADS * 2))
    kwargs = {}
    if s["access_key"] or s["secret_key"]:
        kwargs = {"aws_access_key_id": s["access_key"], "aws_secret_access_key": s["secret_key"]}
    return session.client("s3", endpoint_url=s["endpoint"], region_name=region, config=config,
                          **kwargs)


class NoSuchObject(InputError):
    """The object, or the byte range asked for, is not there (callers may wait for it)."""


class Unreachable(InputError):
    """The store could not answer now (refused, timed out, 5xx, throttled): worth asking again
    (day0.store.retry does, for a bounded time); its message names the endpoint."""


# answers that say "not now" rather than "no": the store is restarting, overloaded or throttling
TRANSIENT_CODES = {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown",
                   "RequestTimeout", "Throttling", "ThrottlingException"}


def translate_error(exc: Exception, uri: str | S3Uri, client=None) -> InputError:
    """An InputError (file = the URI, with a fix) for a boto3/botocore failure: the one mapping
    of S3 errors (the receiver's store checks use it too)."""
    import botocore.exceptions as bx

    where = str(uri)
    endpoint = client.meta.endpoint_url if client is not None else (client_settings()["endpoint"] or "AWS S3")
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError,
                        bx.CredentialRetrievalError)):
        return InputError(f"no S3 credentials ({type(exc).__name__})", file=where,
                          fix=CREDENTIALS_FIX)
    # connection refused or reset, timeouts: every HTTP-level failure before an answer
    if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError)):
        return Unreachable(f"cannot reach the S3 endpoint {endpoint} ({type(exc).__name__})",
                           file=where, fix="check DAY0_S3_ENDPOINT (or AWS_ENDPOINT_URL) and that "
                                           "the object store is running and reachable")
    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "")) or str(exc.response.get("ResponseMetadata", {})
                                                .get("HTTPStatusCode", ""))
        bucket = parse_s3_uri(where).bucket if is_s3(where) else "?"
        if code in TRANSIENT_CODES:
            return Unreachable(f"the S3 endpoint {endpoint} could not answer now ({code})",
                               file=where, fix="check the object store's health and logs")
        if code == "NoSuchBucket":
            return InputError(f"bucket '{bucket}' does not exist at {endpoint}", file=where,
                              fix="correct the bucket name in the URI, or create the bucket")
        if code in ("NoSuchKey", "NotFound"):
            return NoSuchObject("no such object", file=where, fix="check the key in the URI")
        if code in ("InvalidRange", "416"):  # e.g. the first bytes of an empty object
            return NoSuchObject("the object holds no such byte range", file=where,
                                fix="rerun once the upload has finished")
        if code == "404":  # a bare HTTP 404 with no S3 error document
            return InputError(f"{endpoint} answered HTTP 404 without an S3 error: not an S3 "
                              "endpoint, or no such bucket", file=where,
                              fix="check DAY0_S3_ENDPOINT (or AWS_ENDPOINT_URL) and the bucket name")
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                    "InvalidToken", "ExpiredToken", "AllAccessDisabled"):
            return InputError(f"access denied ({code})", file=where,
                              fix="use credentials allowed to read (and for results, write) this "
                                  "bucket: " + CREDENTIALS_FIX)
        if code in ("PreconditionFailed", "412"):
            return InputError("the object changed while it was being read", file=where,
                              fix="rerun once the upload has finished")
        return InputError(f"S3 error {code}: {err.get('Message', exc)}", file=where,
                          fix="check the URI and the object store's logs")
    if isinstance(exc, bx.BotoCoreError):
        return InputError(f"S3 request failed: {exc}", file=where,
                          fix="check DAY0_S3_ENDPOINT, DAY0_S3_REGION and the credentials")
    raise exc


class _Guard:
    """`with _Guard(uri):` turns botocore errors into InputError."""

    def __init__(self, uri, client=None):
        self.uri, self.client = uri, client

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        import botocore.exceptions as bx

        if exc is not None and isinstance(exc, (bx.BotoCoreError, bx.ClientError)):
            raise translate_error(exc, self.uri, self.client) from None
        return False


# --------------------------------------------------------------------------- listing

@dataclass(frozen=True)
class ObjectInfo:
    """One object: its key, size and ETag (quotes stripped)."""

    key: str
    size: int
    etag: str

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]


def _etag(raw: str | None) -> str:
    return (raw or "").strip('"')


def list_objects(uri: str | S3Uri, *, client=None, recursive: bool = False) -> dict[str, ObjectInfo]:
    """Objects under the prefix by name relative to it (direct children unless recursive).

    Returns {} for an empty prefix; raises InputError for a missing bucket or unreachable store.
    """
    u = parse_s3_uri(uri)
    client = client or s3_client()
    prefix = f"{u.key}/" if u.key else ""
    args = {"Bucket": u.bucket, "Prefix": prefix}
    if not recursive:
        args["Delimiter"] = "/"
    out: dict[str, ObjectInfo] = {}
    with _Guard(u, client):
        for page in client.get_paginator("list_objects_v2").paginate(**args):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):]
                if rel and not rel.endswith("/"):
                    out[rel] = ObjectInfo(obj["Key"], int(obj["Size"]), _etag(obj.get("ETag")))
    return out


def head_object(uri: str | S3Uri, *, client=None) -> ObjectInfo | None:
    """Size and ETag of one object, or None when it does not exist."""
    import botocore.exceptions as bx

    u = parse_s3_uri(uri)
    client = client or s3_client()
    with _Guard(u, client):
        try:
            resp = client.head_object(Bucket=u.bucket, Key=u.key)
        except bx.ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
    return ObjectInfo(u.key, int(resp["ContentLength"]), _etag(resp.get("ETag")))


def checkpoint_objects(uri: str | S3Uri, *, client=None) -> tuple[S3Uri, dict[str, ObjectInfo]]:
    """(folder URI, {file name: object}) of a checkpoint at uri: the objects directly under the
    prefix, or - when uri names a single .json object - that object as config.json (no weights).
    InputError when there is nothing there."""
    u = parse_s3_uri(uri)
    client = client or s3_client()
    objects = list_objects(u, client=client)
    if objects:
        return u, objects
    if u.key.endswith(".json"):
        info = head_object(u, client=client)
        if info is not None:
            return u.parent, {"config.json": info}
    raise InputError("no objects under this prefix", file=str(u),
                     fix="check the prefix" + _suggest(u, client))


def _suggest(u: S3Uri, client) -> str:
    """' (did you mean s3://...?)' from the sibling prefixes; '' when nothing is close."""
    import difflib

    parent = u.parent
    prefix = f"{parent.key}/" if parent.key else ""
    try:
        resp = client.list_objects_v2(Bucket=u.bucket, Prefix=prefix, Delimiter="/", MaxKeys=1000)
    except Exception:  # only a hint: never mask the real error
        return ""
    siblings = [p["Prefix"][len(prefix):].rstrip("/") for p in resp.get("CommonPrefixes", [])]
    close = difflib.get_close_matches(u.name, siblings, n=1, cutoff=0.6)
    return f" (did you mean {parent.child(close[0])}?)" if close else ""


# --------------------------------------------------------------------------- reading

def read_object(uri: str | S3Uri, *, client=None, byte_range: str | None = None) -> bytes:
    """Bytes of an object, or of byte_range ("bytes=0-65535"; S3Reader does a checkpoint's
    ranged reads)."""
    u = parse_s3_uri(uri)
    client = client or s3_client()
    with _Guard(u, client):
        args = {"Range": byte_range} if byte_range else {}
        return client.get_object(Bucket=u.bucket, Key=u.key, **args)["Body"].read()


class S3Reader:
    """day0.checkpoint.headers's Reader over a prefix: one listing, ranged GETs, counted.

    A shard's first read fetches its first HEADER_PROBE_BYTES (the 8-byte length and usually
    the whole header) in one GET; a larger header costs one more GET for the rest only. Heads
    of all shards are fetched in parallel on the first shard read. ``bytes_fetched`` and
    ``requests`` count what went over the wire.
    """

    def __init__(self, uri: str | S3Uri, *, client=None, retry=None):
        self.client = client or s3_client()
        # retry(call, where): day0.store.retry.retrying for readers that outlast an outage
        self._retry = retry or (lambda call, where: call())
        self.uri, self._objects = self._retry(
            lambda: checkpoint_objects(uri, client=self.client), str(uri))
        self.path = str(parse_s3_uri(uri))  # what Checkpoint.source shows
        self.bytes_fetched = 0
        self.requests = 0
        self._heads: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._prefetched = False

    def names(self) -> list[str]:
        return sorted(self._objects)

    def size(self, name: str) -> int:
        return self._objects[name].size

    def location(self, name: str) -> str:
        info = self._objects.get(name)
        return f"{SCHEME}{self.uri.bucket}/{info.key}" if info else str(self.uri.child(name))

    def _get(self, name: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object, one ranged GET pinned to the listed ETag."""
        info = self._objects[name]
        args = {"Bucket": self.uri.bucket, "Key": info.key, "Range": f"bytes={start}-{end - 1}"}
        if info.etag:
            args["IfMatch"] = f'"{info.etag}"'

        def get() -> bytes:
            with _Guard(self.location(name), self.client):
                return self.client.get_object(**args)["Body"].read()

        data = self._retry(get, self.location(name))
        with self._lock:
            self.bytes_fetched += len(data)
            self.requests += 1
        return data

    def _prefetch_heads(self) -> None:
        self._prefetched = True
        shards = [n for n in self._objects if n.endswith(".safetensors") and n not in self._heads]
        if len(shards) < 2:
            return

        def fetch(name):
            try:
                size = self.size(name)
                if size:
                    head = self._get(name, 0, min(size, HEADER_PROBE_BYTES))
                    with self._lock:
                        self._heads.setdefault(name, head)
            except InputError:  # the synchronous read below reports it, with its location
                pass

        with ThreadPoolExecutor(PREFETCH_THREADS) as pool:
            list(pool.map(fetch, shards))

    def read_range(self, name: str, start: int, length: int) -> bytes:
        size = self.size(name)
        end = min(start + max(length, 0), size)
        if start >= end:
            return b""
        if name.endswith(".safetensors") and not self._prefetched:
            self._prefetch_heads()
        head = self._heads.get(name, b"")
        if end <= len(head):
            return head[start:end]
        if start <= len(head):  # extend the cached head (the rest of a long header)
            want = end if head else min(size, max(end, HEADER_PROBE_BYTES))
            head = head + self._get(name, len(head), want)
            self._heads[name] = head
            return head[start:end]
        return self._get(name, start, end)


# --------------------------------------------------------------------------- writing

CONTENT_TYPES = {".json": "application/json", ".md": "text/markdown; charset=utf-8",
                 ".txt": "text/plain; charset=utf-8", ".html": "text/html; charset=utf-8"}


def put_object(uri: str | S3Uri, data: bytes | str | Path, *, client=None) -> ObjectInfo:
    """Write bytes (or a local file, multipart when large) to uri; returns the stored object."""
    u = parse_s3_uri(uri)
    client = client or s3_client()
    ctype = CONTENT_TYPES.get(Path(u.key).suffix, "application/octet-stream")
    with _Guard(u, client):
        if isinstance(data, (bytes, bytearray)):
            resp = client.put_object(Bucket=u.bucket, Key=u.key, Body=bytes(data), ContentType=ctype)
            return ObjectInfo(u.key, len(data), _etag(resp.get("ETag")))
        client.upload_file(str(data), u.bucket, u.key, ExtraArgs={"ContentType": ctype})
    return head_object(u, client=client) or ObjectInfo(u.key, Path(data).stat().st_size, "")


# --------------------------------------------------------------------------- results

def safe_segment(part: str) -> str:
    """A path segment from a name, revision or target (no slashes, no '..', no surprises)."""
    import re

    return re.sub(r"[^A-Za-z0-9._=+-]", "-", str(part)).strip(".-") or "unnamed"


def write_results(where: str, files: dict[str, bytes | str | Path], *, client=None) -> None:
    """Write files under a results location (s3:// prefix or local folder ending in '/'); where
    they go is day0.store.identity's (results_location, publish_run)."""
    for name, content in files.items():
        name = "/".join(safe_segment(p) for p in str(name).split("/") if p)
        if not isinstance(content, (bytes, bytearray)) and not Path(content).is_file():
            raise InputError("result file to publish does not exist", file=str(content),
                             fix="pass the report's bytes or an existing file")
        if is_s3(where):
            put_object(where.rstrip("/") + "/" + name, content, client=client)
            continue
        dest = Path(where) / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        # replaced, never written through: a symlink planted at dest is not followed
        write_atomic(dest, bytes(content) if isinstance(content, (bytes, bytearray))
                     else Path(content).read_bytes())


__all__ = ["S3Uri", "ObjectInfo", "S3Reader", "is_s3", "parse_s3_uri", "s3_client",
           "client_settings", "translate_error", "NoSuchObject", "Unreachable", "list_objects",
           "head_object", "checkpoint_objects", "read_object", "put_object", "HEADER_PROBE_BYTES",
           "write_results", "safe_segment"]
