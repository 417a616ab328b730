"""day0.stack.core._get, the probe every start-up poll uses (`day0 server start`, the temporary
Prefect server, the stack's parts): whatever answers that is not HTTP counts as nothing
answering, never an internal error."""

from __future__ import annotations

import socket
import threading

from day0.stack.core import _get


def _serve_once(reply_with) -> int:
    """A loopback listener that answers one connection with reply_with(request bytes)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(reply_with(conn.recv(4096)))
        listener.close()

    threading.Thread(target=answer, daemon=True).start()
    return listener.getsockname()[1]


def test_an_echo_of_the_request_is_nothing_answering():
    """What a socket connected to itself reads back: its own request line (BadStatusLine)."""
    port = _serve_once(lambda request: request)
    assert _get(f"http://127.0.0.1:{port}/api/health") == (0, b"")


def test_garbage_and_a_closed_port_are_nothing_answering_and_http_still_is():
    port = _serve_once(lambda request: b"\x00\x01 not http\r\n\r\n")
    assert _get(f"http://127.0.0.1:{port}/health") == (0, b"")
    port = _serve_once(lambda request: b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert _get(f"http://127.0.0.1:{port}/health") == (200, b"ok")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    assert _get(f"http://127.0.0.1:{closed}/health") == (0, b"")
