"""How the receiver is served: uvicorn with h11, bounded in time and size per connection.

uvicorn (h11) already bounds the request head (h11_max_incomplete_event_size), idle keep-alive
connections (timeout_keep_alive) and concurrency (limit_concurrency: 503 beyond it). It has no
deadline for reading a request, so a client sending a header line every few seconds (slowloris)
or a body byte at a time would hold its connection forever; `GuardedH11Protocol` adds one:
`limits.header_timeout_s` from connection open (or the end of the previous answer) until the
head is complete, then `limits.body_timeout_s` until the body is. h11 also accepts a request
with both Content-Length and Transfer-Encoding (it uses the latter); `FramingGuard` answers
400 and closes, since a proxy in front may have framed it the other way (request smuggling).
"""

from __future__ import annotations

import asyncio
import json
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from day0.receiver.settings import LimitSettings

log = logging.getLogger("day0.receiver")
_408_BODY = b'{"detail": "request not sent in time"}'
_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_408_BODY), _408_BODY))


def guarded_protocol(limits: LimitSettings) -> type[H11Protocol]:
    """An H11Protocol subclass enforcing `limits`' header and body deadlines."""

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _phase: str | None = None  # "head" or "body": what the running deadline waits for

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm("head", limits.header_timeout_s)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _follow(self) -> None:
            """Move the deadline along h11's view of the client's side of the exchange."""
            if self.transport.is_closing():
                return self._disarm()
            state = self.conn.their_state
            if state is h11.IDLE and self._phase != "head" and self._idle_between_requests():
                self._arm("head", limits.header_timeout_s)
            elif state is h11.SEND_BODY and self._phase != "body":
                self._arm("body", limits.body_timeout_s)
            elif state not in (h11.IDLE, h11.SEND_BODY):
                self._disarm()  # request read: the app's own limits apply from here

        def _idle_between_requests(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self, phase: str, seconds: float) -> None:
            self._disarm()
            self._phase = phase
            self._deadline = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline, self._phase = None, None

        def _expired(self) -> None:
            phase = self._phase
            self._deadline, self._phase = None, None
            if self.transport.is_closing():
                return
            if phase == "head" and self.conn.their_state is h11.IDLE and self._idle_between_requests():
                self.transport.write(_TIMEOUT_408)  # nothing of ours in flight: a clean answer
            # in the body phase the app sees a disconnect (one log line) and its answer is dropped
            self.transport.close()

    return GuardedH11Protocol


class FramingGuard:
    """ASGI middleware: 400 and close for Content-Length together with Transfer-Encoding."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                body = json.dumps({"detail": "Content-Length and Transfer-Encoding together"}).encode()
                await send({"type": "http.response.start", "status": 400, "headers": [
                    (b"content-type", b"application/json"), (b"connection", b"close"),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def uvicorn_config(app, settings, **overrides):
    """The uvicorn.Config every receiver runs with (`day0 hooks serve` and ReceiverThread)."""
    import uvicorn

    limits = settings.limits
    # access_log off: SNS senders may carry ?token= in the URL
    options = dict(host=settings.host, port=settings.port, access_log=False, log_level="info",
                   http=guarded_protocol(limits), timeout_keep_alive=limits.keep_alive_s,
                   limit_concurrency=limits.max_connections,
                   h11_max_incomplete_event_size=limits.max_header_bytes, ws="none")
    return uvicorn.Config(app, **{**options, **overrides})
