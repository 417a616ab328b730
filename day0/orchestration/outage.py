"""Clients of the Prefect server wait through a short outage, then stop with a line naming it.

Prefect's client retries a failed request a few times within seconds; a server restarting takes
longer. A waiting client (``day0 stack upload --wait``, ``day0 validate --deployment``) keeps
polling while the server refuses or drops connections, backing off, for at most
``client_outage_s`` (day0/data/recovery.yaml) of continuous failure; past it, PrefectDown:
exit 3 and one line that names the server, never an internal error.
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Callable, TypeVar

from day0.errors import Day0Error

T = TypeVar("T")


class PrefectDown(Day0Error):
    """The Prefect server did not answer for longer than a client waits."""

    exit_code = 3


def _transient(exc: BaseException) -> bool:
    """A refused, dropped or timed-out connection, or a 5xx/429 answer: worth waiting for."""
    import httpx

    if isinstance(exc, (httpx.TransportError, ConnectionError, TimeoutError)):
        return True
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return isinstance(status, int) and (status >= 500 or status == 429)


def outage_s() -> float:
    from day0.orchestration.recovery import settings

    return float(settings().client_outage_s)


@contextlib.contextmanager
def waiting_client():
    """A sync Prefect client whose requests fail fast (one retry), so that the Outage around it
    does the waiting: said to the user, backed off, bounded by client_outage_s (Prefect's own
    five retries would block one call for about a minute, silently)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 1}), \
            get_client(sync_client=True) as client:
        yield client


class Outage:
    """Tracks one client's continuous failure; `failed` sleeps (backing off) or raises."""

    def __init__(self, api: str, what: str, limit_s: float | None = None,
                 say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.api, self.what, self.say = api, what, say
        self.limit_s = outage_s() if limit_s is None else limit_s
        self.clock, self.sleep = clock, sleep
        self.since: float | None = None
        self.tries = 0

    def ok(self) -> None:
        if self.since is not None and self.say:
            self.say(f"  (the Prefect server answers again after {self.clock() - self.since:.0f} s)")
        self.since, self.tries = None, 0

    def failed(self, exc: BaseException) -> None:
        """Re-raise what is no outage; PrefectDown past the limit; else wait a little."""
        if not _transient(exc):
            raise exc
        now = self.clock()
        if self.since is None:
            self.since = now
            if self.say:
                self.say(f"  (the Prefect server at {self.api} does not answer: "
                         f"{type(exc).__name__}; waiting up to {self.limit_s:.0f} s)")
        down = now - self.since
        if down >= self.limit_s:
            raise PrefectDown(
                f"the Prefect server at {self.api} did not answer for {down:.0f} s while "
                f"{self.what} ({type(exc).__name__})", field="Prefect server",
                fix="start it again (`day0 stack up` restarts what is missing), then rerun") \
                from None
        self.tries += 1
        delay = min(10.0, 0.5 * 2 ** min(self.tries, 5)) * random.uniform(0.8, 1.2)
        self.sleep(min(delay, max(0.1, self.limit_s - down)))

    def call(self, fn: Callable[[], T]) -> T:
        """fn() until it answers, through an outage of at most limit_s."""
        while True:
            try:
                out = fn()
            except Exception as exc:  # noqa: BLE001 - sorted by failed()
                self.failed(exc)
                continue
            self.ok()
            return out


__all__ = ["Outage", "PrefectDown", "outage_s", "waiting_client"]
