"""Request authentication: bearer/basic/query tokens, HF webhook secret, signed releases.

Every comparison is constant-time (hmac.compare_digest). A sender is either authenticated or
gets 401 with a reason that names what is missing, never which part of a secret was wrong.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

from day0.errors import AuthError  # 401, in day0.errors' tree; imported from here too

TIMESTAMP_HEADER = "X-Day0-Timestamp"
SIGNATURE_HEADER = "X-Day0-Signature"
HF_SECRET_HEADER = "X-Webhook-Secret"


def _equal(given: bytes, expected: bytes) -> bool:
    return hmac.compare_digest(given, expected)


def check_token(headers: Mapping[str, str], query: Mapping[str, str], expected: bytes | None,
                allow_query: bool = False) -> None:
    """Accept 'Authorization: Bearer T', Basic auth whose password is T, or (opt-in) ?token=T."""
    if expected is None:
        raise AuthError("no token is configured for this endpoint")
    auth = headers.get("authorization", "")
    scheme, _, value = auth.strip().partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer" and value.strip():
        if _equal(value.strip().encode(), expected):
            return
        raise AuthError("invalid bearer token")
    if scheme == "basic" and value.strip():
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise AuthError("malformed basic credentials") from None
        _, sep, password = decoded.partition(b":")
        if sep and _equal(password, expected):
            return
        raise AuthError("invalid basic credentials")
    if allow_query and query.get("token"):
        if _equal(query["token"].encode(), expected):
            return
        raise AuthError("invalid token")
    raise AuthError("missing credentials (Authorization: Bearer <token>)")


def check_shared_secret(given: str | None, expected: bytes | None, header: str) -> None:
    """A secret sent verbatim in a header (Hugging Face Hub: X-Webhook-Secret)."""
    if expected is None:
        raise AuthError(f"no secret is configured for {header}")
    if not given:
        raise AuthError(f"missing {header}")
    if not _equal(given.encode(), expected):
        raise AuthError(f"invalid {header}")


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """'sha256=<hex>' of HMAC-SHA256(secret, timestamp + '.' + body)."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """Headers a sender adds to a generic release webhook (used by tests, bench and scripts)."""
    key = secret.encode() if isinstance(secret, str) else secret
    ts = str(int(time.time()) if timestamp is None else timestamp)
    return {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: signature(key, ts, body),
            "Content-Type": "application/json"}


def check_signature(headers: Mapping[str, str], body: bytes, secret: bytes | None,
                    window_s: int, now: float | None = None) -> None:
    """Verify X-Day0-Signature over X-Day0-Timestamp + '.' + body within the replay window."""
    if secret is None:
        raise AuthError("no release_hmac secret is configured")
    ts = headers.get(TIMESTAMP_HEADER.lower(), "")
    sig = headers.get(SIGNATURE_HEADER.lower(), "")
    if not ts or not sig:
        raise AuthError(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}")
    if not ts.isascii() or not ts.isdigit() or len(ts) > 12:
        raise AuthError(f"{TIMESTAMP_HEADER} must be Unix seconds")
    # the MAC is checked before the clock so that an unsigned request learns nothing about time
    if not _equal(sig.strip().encode(), signature(secret, ts, body).encode()):
        raise AuthError("invalid signature")
    age = (time.time() if now is None else now) - int(ts)
    if abs(age) > window_s:
        when = "old" if age > 0 else "in the future"
        raise AuthError(f"stale timestamp: {abs(int(age))} s {when}, window is {window_s} s")
