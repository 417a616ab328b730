"""Authentication primitives: tokens, the Hub's shared secret, signed releases and replay window."""

from __future__ import annotations

import base64
import time

import pytest

from day0.receiver import auth
from day0.receiver.auth import AuthError

KEY = b"s3cret"


def _lower(headers: dict) -> dict:
    return {k.lower(): v for k, v in headers.items()}


def test_bearer_basic_and_query_tokens():
    auth.check_token({"authorization": "Bearer s3cret"}, {}, KEY)
    basic = base64.b64encode(b"sns:s3cret").decode()
    auth.check_token({"authorization": f"Basic {basic}"}, {}, KEY)
    auth.check_token({}, {"token": "s3cret"}, KEY, allow_query=True)
    with pytest.raises(AuthError, match="invalid bearer"):
        auth.check_token({"authorization": "Bearer s3cre"}, {}, KEY)
    with pytest.raises(AuthError, match="invalid basic"):
        auth.check_token({"authorization": "Basic " + base64.b64encode(b"s3cret:x").decode()}, {}, KEY)
    with pytest.raises(AuthError, match="malformed"):
        auth.check_token({"authorization": "Basic %%%"}, {}, KEY)
    with pytest.raises(AuthError, match="missing"):
        auth.check_token({}, {"token": "s3cret"}, KEY)  # query tokens are opt-in per endpoint
    with pytest.raises(AuthError, match="no token is configured"):
        auth.check_token({"authorization": "Bearer anything"}, {}, None)


def test_hub_shared_secret():
    auth.check_shared_secret("s3cret", KEY, "X-Webhook-Secret")
    for given, why in ((None, "missing"), ("", "missing"), ("s3cret ", "invalid")):
        with pytest.raises(AuthError, match=why):
            auth.check_shared_secret(given, KEY, "X-Webhook-Secret")
    with pytest.raises(AuthError, match="no secret"):
        auth.check_shared_secret("s3cret", None, "X-Webhook-Secret")


def test_signature_round_trip_and_tampering():
    body = b'{"model": "m", "revision": "r", "source": "s"}'
    headers = _lower(auth.sign(KEY, body))
    auth.check_signature(headers, body, KEY, 300)
    assert headers["x-day0-signature"].startswith("sha256=")
    with pytest.raises(AuthError, match="invalid signature"):
        auth.check_signature(headers, body + b" ", KEY, 300)
    with pytest.raises(AuthError, match="invalid signature"):
        auth.check_signature(headers, body, b"other", 300)
    # the timestamp is inside the MAC: moving it breaks the signature
    moved = {**headers, "x-day0-timestamp": str(int(headers["x-day0-timestamp"]) + 1)}
    with pytest.raises(AuthError, match="invalid signature"):
        auth.check_signature(moved, body, KEY, 300)


def test_replay_window_both_ways():
    body = b"{}"
    now = time.time()
    auth.check_signature(_lower(auth.sign(KEY, body, int(now) - 299)), body, KEY, 300, now=now)
    with pytest.raises(AuthError, match="stale timestamp: 301 s old"):
        auth.check_signature(_lower(auth.sign(KEY, body, int(now) - 301)), body, KEY, 300, now=now)
    with pytest.raises(AuthError, match="in the future"):
        auth.check_signature(_lower(auth.sign(KEY, body, int(now) + 400)), body, KEY, 300, now=now)


@pytest.mark.parametrize("headers,why", [
    ({}, "missing"),
    ({"x-day0-timestamp": "1"}, "missing"),
    ({"x-day0-timestamp": "12.5", "x-day0-signature": "sha256=00"}, "Unix seconds"),
    ({"x-day0-timestamp": "-5", "x-day0-signature": "sha256=00"}, "Unix seconds"),
])
def test_malformed_signature_headers(headers, why):
    with pytest.raises(AuthError, match=why):
        auth.check_signature(headers, b"{}", KEY, 300)


def test_unset_secret_never_authenticates():
    body = b"{}"
    with pytest.raises(AuthError, match="no release_hmac"):
        auth.check_signature(_lower(auth.sign(b"", body)), body, None, 300)
