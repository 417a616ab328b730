"""Helpers shared by the receiver tests: signed posts, Prefect run counting, bounded waits."""

from __future__ import annotations

import json
import time

import httpx

from day0.receiver.auth import sign
from tests.receiver.conftest import SECRETS
from tests.receiver.loadgen import flow_run_keys, wait_drained

ADMIN = {"Authorization": f"Bearer {SECRETS['admin_token']}"}


def post_release(url: str, payload, secret: str = SECRETS["release_hmac"], ts: int | None = None,
                 headers: dict | None = None) -> httpx.Response:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return httpx.post(f"{url}/v1/webhooks/release", content=body,
                      headers={**sign(secret, body, ts), **(headers or {})}, timeout=30)


def wait_until(predicate, timeout_s: float = 20.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def journal_stats(url: str) -> dict:
    return httpx.get(f"{url}/healthz", headers=ADMIN, timeout=10).json()["journal"]


def settled(url: str, timeout_s: float = 20.0) -> dict:
    """Wait until the receiver has nothing pending (no release to submit, no prefix to check)."""
    stats = wait_drained(url, SECRETS["admin_token"], timeout_s)
    assert stats and not stats["releases"]["pending"] and not stats["prefixes"]["unchecked"], (
        f"receiver still busy after {timeout_s} s: {stats}")
    return stats


def runs(deployment, key_prefix: str):
    """Counter idempotency key -> number of flow runs of the test deployment."""
    return flow_run_keys(deployment.id, key_prefix)
