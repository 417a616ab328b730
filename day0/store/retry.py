"""Waiting out a short object-store outage: one retry helper for store reads and publishing.

``retrying(call, where)`` calls again, with exponential backoff, while the store cannot answer
(:class:`~day0.store.s3.Unreachable`: refused, timed out, 5xx, throttled) for at most a bounded
time (day0/data/store.yaml), then raises :class:`~day0.errors.StoreDown` naming the endpoint:
exit 3, an ERROR of the stage, never a verdict about the target. An answer (no such object,
access denied, no bucket) is raised at once: asking again would get the same answer. botocore's
own retries (day0.store.s3: 3 attempts per request) run inside each call.

``read_optional(uri)`` is the retried read baselines, the reference bank and stored evaluation
results use; ``probe(client)`` asks once, briefly, whether a store answers at all.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache
from typing import Callable, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from day0 import DATA_DIR
from day0.errors import StoreDown
from day0.store.s3 import NoSuchObject, Unreachable, s3_client, translate_error

T = TypeVar("T")
SETTINGS_FILE = DATA_DIR / "store.yaml"
SETTINGS_ENV = "DAY0_STORE_SETTINGS"


class Backoff(BaseModel):
    """How long, and how often, a store that cannot answer is asked again."""

    model_config = ConfigDict(extra="forbid")

    total_s: float = Field(ge=0, le=3600, description=(
        "Asked again for at most this long (0: once); then StoreDown. An attempt in flight "
        "when it runs out adds its own timeouts."))
    first_backoff_s: float = Field(gt=0, le=60, description="Wait before the second attempt.")
    max_backoff_s: float = Field(gt=0, le=600, description=(
        "Longest wait between attempts (each wait doubles up to it)."))


class OutboxSettings(BaseModel):
    """day0.store.outbox: runs a store outage left unpublished."""

    model_config = ConfigDict(extra="forbid")

    drain_every_s: float = Field(gt=0, le=3600, description=(
        "`day0 serve` publishes what the outbox holds this often (when the store answers)."))
    state_give_up_s: float = Field(gt=0, description=(
        "A run already published whose Prefect flow run could not be reached (to set its "
        "verdict's state) for this long is dropped from the outbox."))


class ProbeSettings(BaseModel):
    """One brief request that says whether a store answers at all."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(gt=0, le=60, description=(
        "Connect and read timeout of the probe's one request (one attempt)."))
    cache_s: float = Field(ge=0, le=600, description="A probe's answer is reused this long.")


class StoreSettings(BaseModel):
    """day0/data/store.yaml."""

    model_config = ConfigDict(extra="forbid")

    reads: Backoff = Field(description=(
        "Reads of baselines, reference banks and stored evaluation results."))
    publish: Backoff = Field(description=(
        "Publishing a run's files and latest.json, within the flow."))
    outbox: OutboxSettings = Field(description="The outbox of unpublished runs.")
    probe: ProbeSettings = Field(description="The is-it-up request (/healthz, outbox drains).")


def settings() -> StoreSettings:
    """store.yaml, with the sections of $DAY0_STORE_SETTINGS (a YAML file) laid over it."""
    return _settings(os.environ.get(SETTINGS_ENV) or "")


@lru_cache(maxsize=4)
def _settings(override: str) -> StoreSettings:
    from day0.yamlio import load_model, read_mapping

    data = read_mapping(SETTINGS_FILE)
    where = str(SETTINGS_FILE)
    if override:
        extra = read_mapping(override) or {}
        where = f"{override} over {SETTINGS_FILE}"
        for section, values in (extra.items() if isinstance(extra, dict) else ()):
            data[section] = ({**data[section], **values} if isinstance(values, dict)
                             and isinstance(data.get(section), dict) else values)
    return load_model(StoreSettings, data, where)


def retrying(call: Callable[[], T], where: str, *, policy: Backoff | None = None,
             log: Callable[[str], None] | None = None, sleep=time.sleep) -> T:
    """call(), asked again while the store is Unreachable, for policy.total_s at most (default
    store.yaml's reads); then StoreDown naming the endpoint. Any other error at once."""
    policy = policy or settings().reads
    deadline = time.monotonic() + policy.total_s
    delay = policy.first_backoff_s
    while True:
        try:
            return call()
        except Unreachable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreDown(
                    f"the object store did not answer for {policy.total_s:g} s: "
                    f"{exc.problems[0].message}", file=where,
                    fix="start the object store or correct DAY0_S3_ENDPOINT; how long day0 waits "
                        f"for it is day0/data/store.yaml ({SETTINGS_ENV})") from None
            if log:
                log(f"{exc.problems[0].message}: asking again in {min(delay, left):.1f} s")
            sleep(min(delay, left))
            delay = min(delay * 2, policy.max_backoff_s)


def read_optional(uri: str, *, client=None, policy: Backoff | None = None,
                  log: Callable[[str], None] | None = None) -> bytes | None:
    """The object's bytes, None when there is no such object (one GET, no HEAD first); a store
    that cannot answer is asked again (:func:`retrying`; log gets a line per wait)."""
    from day0.store.s3 import read_object

    def once() -> bytes | None:
        try:
            return read_object(uri, client=client)
        except NoSuchObject:
            return None

    return retrying(once, uri, policy=policy, log=log)


def probe(client=None, bucket: str | None = None) -> str | None:
    """None when the store answers at all (any S3 answer, "access denied" too: it is up), else
    why not, from one brief request (store.yaml probe.timeout_s, one attempt): HEAD of bucket,
    or ListBuckets without one."""
    if client is None:
        timeout = settings().probe.timeout_s
        client = s3_client(connect_timeout=timeout, read_timeout=timeout, max_attempts=1)
    try:
        if bucket:
            client.head_bucket(Bucket=bucket)
        else:
            client.list_buckets()
    except Exception as exc:  # noqa: BLE001 - what the store says is sorted out below
        try:
            err = translate_error(exc, f"s3://{bucket}" if bucket else "s3://", client)
        except Exception:  # not a store error at all: say what it was
            return f"{type(exc).__name__}: {exc}"
        return err.problems[0].message if isinstance(err, Unreachable) else None
    return None


__all__ = ["Backoff", "StoreSettings", "settings", "retrying", "read_optional", "probe",
           "SETTINGS_ENV"]
