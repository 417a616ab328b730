"""Is the checkpoint under s3://bucket/prefix complete? Asked of the store, never of the events.

Object-store events arrive one per file and in any order, so an event only says "look again".
A prefix is complete when config.json, model.safetensors.index.json (or a single
model.safetensors), every shard the index names and any extra required file are present, and
each shard's size equals 8 + header length + end of its last tensor (read with one ranged GET;
verified shards are remembered by ETag). The model and revision of a complete checkpoint are
day0.store.identity's, from the same listing: the key prefix without the bucket, and the listing
revision of the prefix's objects (names, ETags, sizes) - exactly what a manual run of
s3://bucket/prefix computes - so re-uploading identical files is the same release and changing
any file is a new one.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import posixpath
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from day0.store import identity
from day0.errors import InputError, StoreError
from day0.receiver.journal import Journal, PrefixState, ReleaseRow
from day0.receiver.settings import CheckpointSettings, S3Settings
from day0.checkpoint.safetensors_header import expected_size, header_length, parse_header
from day0.store.s3 import HEADER_PROBE_BYTES, NoSuchObject, ObjectInfo, S3Uri

# the receiver's log (app.py adds its escaping filter): one line per check that ran, whether an
# event's answer or the worker's later pass ran it
log = logging.getLogger("day0.receiver")

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass
class CheckResult:
    complete: bool
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    revision: str | None = None
    files: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def detail(self) -> str:
        if self.complete:
            return f"complete: {len(self.files)} files, revision {self.revision}"
        parts = []
        shards = [m for m in self.missing if m.endswith(".safetensors")]
        others = [m for m in self.missing if not m.endswith(".safetensors")]
        if shards:
            parts.append(f"waiting for {len(shards)} shard{'s' if len(shards) != 1 else ''}")
        if others:
            parts.append("waiting for " + ", ".join(others))
        parts.extend(self.problems)
        return "; ".join(parts)


def make_client(cfg: S3Settings):
    """day0.store.s3's S3 client (DAY0_S3_*, AWS settings, the receiver's s3: on top) with the
    receiver's short timeouts: a store that never answers must fail a check in seconds, not in
    the minutes a validation run may wait for a download."""
    from day0.store.s3 import s3_client

    def value(secret):
        return secret.get_secret_value() if secret is not None else None

    return s3_client(endpoint=cfg.endpoint_url, region=cfg.region,
                     access_key=value(cfg.access_key_id), secret_key=value(cfg.secret_access_key),
                     connect_timeout=cfg.request_timeout_s, read_timeout=cfg.request_timeout_s,
                     max_attempts=cfg.max_attempts)


def model_of(bucket: str, prefix: str) -> str:
    """The model name of a checkpoint prefix (day0.store.identity: the prefix without the bucket)."""
    return identity.model_name(str(S3Uri(bucket, prefix)))


def included(bucket: str, key: str, rules: CheckpointSettings) -> bool:
    """Is this object under the receiver's watch (checkpoint.include)?"""
    return any(fnmatch.fnmatchcase(f"{bucket}/{key}", pat) for pat in rules.include)


def relevant(bucket: str, key: str, rules: CheckpointSettings) -> bool:
    """Does an event for this object make its prefix worth checking?"""
    name = posixpath.basename(key)
    if not included(bucket, key, rules):
        return False
    return name in (CONFIG, INDEX) or name.endswith(".safetensors") or name in rules.require


def _expected_size(client, bucket: str, key: str) -> int:
    """8 + header length + largest tensor end offset, from one (rarely two) ranged GETs."""
    head = _get(client, bucket, key, f"bytes=0-{HEADER_PROBE_BYTES - 1}")
    n = header_length(head)  # the same parser and limit as analysis (day0.checkpoint.safetensors_header)
    raw = head[8:8 + n] if len(head) >= 8 + n else _get(client, bucket, key, f"bytes=8-{7 + n}")
    if len(raw) < n:
        raise ValueError("header is truncated")
    return expected_size(n, parse_header(raw))


def _get(client, bucket: str, key: str, byte_range: str | None = None) -> bytes:
    """An object's bytes; FileNotFoundError when it (or the range) is not there, StoreError
    when the store cannot answer (S3 errors mapped by day0.store.s3, as everywhere)."""
    from day0.store.s3 import read_object

    try:
        return read_object(S3Uri(bucket, key), client=client, byte_range=byte_range)
    except NoSuchObject:
        raise FileNotFoundError(key) from None
    except InputError as exc:  # down, denied, throttled: look again later
        raise StoreError(str(exc)) from None


def _list(client, bucket: str, prefix: str) -> dict[str, ObjectInfo]:
    """The objects directly under prefix, by name."""
    from day0.store.s3 import list_objects

    try:
        return list_objects(S3Uri(bucket, prefix), client=client)
    except InputError as exc:  # down, denied, no bucket yet: look again later
        raise StoreError(str(exc)) from None


class HeaderCache:
    """(bucket, key, etag, size) -> expected size; shards are immutable per ETag."""

    def __init__(self, limit: int = 100_000):
        self._data: dict[tuple, int | str] = {}
        self._lock = threading.Lock()
        self._limit = limit

    def get(self, k):
        with self._lock:
            return self._data.get(k)

    def put(self, k, v) -> None:
        with self._lock:
            if len(self._data) >= self._limit:
                self._data.clear()
            self._data[k] = v


def check_prefix(client, bucket: str, prefix: str, rules: CheckpointSettings,
                 cache: HeaderCache | None = None) -> CheckResult:
    """Ask the store whether s3://bucket/prefix holds a complete checkpoint."""
    cache = cache or HeaderCache()
    listing = _list(client, bucket, prefix)
    files = {n: (o.size, o.etag) for n, o in listing.items()}
    join = (lambda n: f"{prefix}/{n}") if prefix else (lambda n: n)
    missing: list[str] = []
    problems: list[str] = []
    if CONFIG not in files:
        missing.append(CONFIG)
    shards: list[str] = []
    if INDEX in files:
        size, _ = files[INDEX]
        if size > rules.max_index_bytes:
            problems.append(f"{INDEX} is {size} bytes, above checkpoint.max_index_bytes")
        else:
            try:
                index = json.loads(_get(client, bucket, join(INDEX)))
                shards = sorted(set(index["weight_map"].values()))
                if not shards or not all(isinstance(s, str) and s for s in shards):
                    raise ValueError("weight_map names no shard")
            except FileNotFoundError:
                missing.append(INDEX)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                problems.append(f"{INDEX} unreadable: {exc}")
    elif SINGLE in files:
        shards = [SINGLE]
    else:
        missing.append(INDEX)
    for name in [*shards, *rules.require]:
        if name not in files and "/" in name:  # index names a file in a sub-folder
            files.update(_head(client, bucket, join(name), name))
        if name not in files or files[name][0] == 0:
            missing.append(name)
        elif name.endswith(".safetensors") and rules.verify_headers:
            problem = _verify_shard(client, bucket, join(name), files[name], cache)
            if problem:
                problems.append(f"{name}: {problem}")
    if missing or problems:
        return CheckResult(complete=False, missing=missing, problems=problems)
    needed = sorted({CONFIG, *shards, *rules.require} | ({INDEX} if INDEX in files else set()))
    # the revision a manual run computes from the same listing (day0.store.identity), not one of ours
    return CheckResult(complete=True, revision=identity.listing_revision(listing),
                       files={n: files[n] for n in needed})


def _head(client, bucket: str, key: str, name: str) -> dict[str, tuple[int, str]]:
    from day0.store.s3 import head_object

    try:
        info = head_object(S3Uri(bucket, key), client=client)
    except InputError as exc:
        raise StoreError(str(exc)) from None
    return {name: (info.size, info.etag)} if info else {}


def _verify_shard(client, bucket: str, key: str, info: tuple[int, str], cache: HeaderCache) -> str | None:
    size, etag = info
    ck = (bucket, key, etag, size)
    expected = cache.get(ck)
    if expected is None:
        try:
            expected = _expected_size(client, bucket, key)
        except FileNotFoundError:
            return "vanished while checking"
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            expected = f"not a safetensors file ({exc})"
        cache.put(ck, expected)
    if isinstance(expected, str):
        return expected
    if expected != size:
        return f"size {size} but its header says {expected} (upload incomplete?)"
    return None


class Checker:
    """Runs completeness checks for recorded prefixes, one at a time per prefix."""

    def __init__(self, journal: Journal, client_factory: Callable[[], Any], rules: CheckpointSettings,
                 targets: list[str]):
        self.journal, self.rules, self.targets = journal, rules, targets
        self._client_factory = client_factory
        self._client = None
        self._cache = HeaderCache()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def client(self):
        with self._guard:
            if self._client is None:
                self._client = self._client_factory()
            return self._client

    def _lock(self, bucket: str, prefix: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((bucket, prefix), threading.Lock())

    def check(self, bucket: str, prefix: str) -> CheckResult:
        """One check of s3://bucket/prefix, journaling nothing (a release without a revision)."""
        return check_prefix(self.client(), bucket, prefix, self.rules, self._cache)

    def ensure_checked(self, bucket: str, prefix: str, generation: int) -> tuple[PrefixState, list[bool]]:
        """Check unless a check already covered `generation`; returns state and new-release flags.

        Raises StoreError when the store cannot be read (the prefix stays due for the worker).
        """
        with self._lock(bucket, prefix):
            state = self.journal.prefix(bucket, prefix)
            if state is None or state.checked >= generation:
                return state, []
            covered = state.generation  # events recorded before this point are all covered
            listed_at = time.time()
            result = check_prefix(self.client(), bucket, prefix, self.rules, self._cache)
            releases = []
            settling = (f"complete; a release once no object has landed for "
                        f"{self.rules.settle_s:g} s (checkpoint.settle_s)")
            if result.complete and self.rules.settle_s > 0 and self.journal.settling(
                    bucket, prefix, self.rules.settle_s, listed_at, settling):
                # files may still be landing (tokenizer.json after the index): checked again
                # once quiet, so the release names the whole upload's revision
                log.info("s3://%s/%s %s", bucket, prefix, settling)
                return self.journal.prefix(bucket, prefix), []
            if result.complete:
                model, source = model_of(bucket, prefix), str(S3Uri(bucket, prefix))
                releases = [ReleaseRow(model=model, revision=result.revision, target=t,
                                       source=source, origin="s3") for t in self.targets]
            missing = len(result.missing) if not result.complete else 0
            fresh = self.journal.finish_check(
                bucket, prefix, covered, "complete" if result.complete else "waiting",
                missing, result.detail, result.revision, releases)
            if result.complete:
                log.info("s3://%s/%s complete (revision %s): %d new release(s)", bucket, prefix,
                         result.revision, sum(fresh))
            else:
                log.info("s3://%s/%s not complete yet: %s", bucket, prefix, result.detail)
            return self.journal.prefix(bucket, prefix), fresh
