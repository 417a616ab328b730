"""Completeness checks off the request path and off the submission path.

A store that accepts connections and never answers must delay only what needs the store: the
checks run on their own bounded thread pool (`checks.concurrency` threads, at most
`checks.queue` waiting), one at a time per prefix, and every caller waits for them with a
deadline instead of joining them. Threads cannot be killed, so a stuck check keeps its thread
until botocore's own timeouts (s3.request_timeout_s x s3.max_attempts per request) end it;
meanwhile it counts as "stuck" and the store is reported degraded. /healthz also asks the store
itself (StoreProbe: one brief request, cached a few seconds), so an outage shows while no
check runs.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from day0.receiver.completeness import Checker, StoreError
from day0.receiver.safety import escape
from day0.receiver.settings import CheckSettings


class StoreHealth:
    """What /healthz says about the store: the last check's outcome and checks stuck past timeout."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self.state = "unknown"  # no check has finished yet
        self.detail: str | None = None
        self.since = time.time()

    def ok(self) -> None:
        with self._lock:
            if self.state != "ok":
                self.state, self.detail, self.since = "ok", None, time.time()

    def failed(self, detail: str) -> None:
        with self._lock:
            if self.state != "degraded":
                self.since = time.time()
            self.state, self.detail = "degraded", escape(detail, 500)

    def report(self, oldest_running_s: float | None, running: int, queued: int,
               probe: "ProbeResult | None" = None) -> dict:
        """The store as it is: degraded when the probe finds it down (whatever the last check
        said: no check may have run since it went), a check is stuck, or the last check failed;
        ok when the probe reaches it and no check failed."""
        with self._lock:
            state, detail, since = self.state, self.detail, self.since
        if oldest_running_s is not None and oldest_running_s > self.timeout_s:
            state = "degraded"
            detail = f"a store check has been running for {oldest_running_s:.0f} s"
        if probe is not None and probe.down:
            if state != "degraded":
                since = probe.since
            state, detail = "degraded", escape(probe.down, 500)
        elif probe is not None and state == "unknown":
            state = "ok"  # no check yet, but the store answers
        out = {"state": state, "detail": detail, "since": since, "checks_running": running,
               "checks_queued": queued}
        if probe is not None:
            out["probe"] = {"reachable": probe.down is None, "at": probe.at}
        return out


@dataclass(frozen=True)
class ProbeResult:
    down: str | None  # why the store did not answer; None: it answered
    at: float  # when it was asked (epoch seconds)
    since: float  # since when it has been in this condition


class StoreProbe:
    """Is the store up? One brief request (day0.store.retry.probe), asked at most once per
    store.yaml probe.cache_s; callers meanwhile get the last answer instead of waiting."""

    def __init__(self, ask: Callable[[], str | None], cache_s: float):
        self._ask, self.cache_s = ask, cache_s
        self._lock = threading.Lock()  # one probe in flight
        self._last: ProbeResult | None = None

    def result(self) -> ProbeResult:
        last = self._last
        if last is not None and time.time() - last.at < self.cache_s:
            return last
        if not self._lock.acquire(blocking=last is None):
            return last  # another caller is asking: its answer is at most a probe away
        try:
            down = self._ask()
            now = time.time()
            same = last is not None and (last.down is None) == (down is None)
            self._last = ProbeResult(down, now, last.since if same else now)
            return self._last
        finally:
            self._lock.release()


class CheckRunner:
    """Runs Checker.ensure_checked (and Checker.check, for a release that names no revision) on
    a bounded pool; one of each in flight per prefix."""

    def __init__(self, checker: Checker, cfg: CheckSettings):
        self.checker, self.cfg = checker, cfg
        self.health = StoreHealth(cfg.timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="day0-check")
        self._lock = threading.Lock()
        self._inflight: dict[tuple, Future] = {}
        self._started: dict[tuple, float] = {}
        self._listeners: list[Callable[[], None]] = []

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from a pool thread) whenever a check ends (the worker's wake)."""
        self._listeners.append(callback)

    def running(self, bucket: str, prefix: str) -> bool:
        with self._lock:
            return (bucket, prefix) in self._inflight

    def capacity(self) -> int:
        """How many more checks may be started before the queue is full."""
        with self._lock:
            return self.cfg.concurrency + self.cfg.queue - len(self._inflight)

    def submit(self, bucket: str, prefix: str, generation: int) -> Future | None:
        """The check of (bucket, prefix) in flight, a new one, or None when the queue is full.

        A check already in flight may not cover `generation`; the journal then still shows the
        prefix as due and the worker checks it again.
        """
        return self._start((bucket, prefix), self.checker.ensure_checked, bucket, prefix, generation)

    def lookup(self, bucket: str, prefix: str) -> Future | None:
        """A check of (bucket, prefix) that journals nothing (its CheckResult: the revision of
        a release announced without one), shared by concurrent callers; None when full."""
        return self._start(("lookup", bucket, prefix), self.checker.check, bucket, prefix)

    def _start(self, key: tuple, fn: Callable, *args) -> Future | None:
        with self._lock:
            fut = self._inflight.get(key)
            if fut is not None:
                return fut
            if len(self._inflight) >= self.cfg.concurrency + self.cfg.queue:
                return None
            fut = self._pool.submit(self._run, key, fn, *args)
            self._inflight[key] = fut
        fut.add_done_callback(lambda f, key=key: self._finished(key, f))
        return fut

    def _run(self, key: tuple, fn: Callable, *args):
        with self._lock:
            self._started[key] = time.monotonic()
        return fn(*args)

    def _finished(self, key: tuple, fut: Future) -> None:
        with self._lock:
            self._inflight.pop(key, None)
            self._started.pop(key, None)
        exc = None if fut.cancelled() else fut.exception()
        if isinstance(exc, StoreError):
            self.health.failed(str(exc))
        elif exc is None and not fut.cancelled():
            self.health.ok()
        for callback in self._listeners:
            callback()

    def timed_out(self, bucket: str, prefix: str) -> None:
        """A caller gave up waiting for this prefix's check after checks.timeout_s."""
        self.health.failed(f"check of s3://{bucket}/{prefix} took longer than {self.cfg.timeout_s:g} s")

    def report(self, probe: ProbeResult | None = None) -> dict:
        now = time.monotonic()
        with self._lock:
            oldest = min(self._started.values(), default=None)
            running, queued = len(self._started), len(self._inflight) - len(self._started)
        return self.health.report(None if oldest is None else now - oldest, running, queued,
                                  probe)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
