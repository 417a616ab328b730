"""Untrusted senders cannot hang, exhaust or escape the receiver (issue 9), against real servers
on loopback: traversal names and foreign sources, slow clients, a store that never answers,
request smuggling framing, client disconnects and forged log lines, trust_remote_code."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from urllib.parse import quote_plus

import httpx
import pytest

from day0.receiver.auth import sign
from day0.receiver.launch import ReceiverProcess, ReceiverThread, write_config
from day0.receiver.safety import escape
from tests.receiver.conftest import FAST_SUBMIT, SECRETS, receiver_settings
from tests.receiver.support import ADMIN, post_release, runs, settled, wait_until
from tests.receiver.test_events import filer_event, s3_record

pytestmark = pytest.mark.integration
S3_AUTH = {"Authorization": f"Bearer {SECRETS['s3_token']}"}


def release(model: str, source: str | None = None, **extra) -> dict:
    return {"model": model, "revision": "0123abcd", "source": source or f"s3://models/{model}", **extra}


def journal_rows(path) -> tuple[int, int]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return (db.execute("SELECT COUNT(*) FROM releases").fetchone()[0],
                db.execute("SELECT COUNT(*) FROM prefixes").fetchone()[0])
    finally:
        db.close()


def read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    data = b""
    try:
        while len(data) < 1 << 20:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return data


def test_escape_keeps_log_values_on_one_line():
    forged = "org/m\n2026 INFO forged\r\x1b[31m\u2028"
    assert escape(forged) == "org/m\\x0a2026 INFO forged\\x0d\\x1b[31m\\u2028"
    assert escape("x" * 1000, limit=10) == "xxxxxxxxxx...(+990 chars)"
    assert escape("org/my model") == "org/my model"


def test_traversal_names_and_foreign_sources_are_refused_and_not_journaled(receiver):
    url = receiver.url
    before = journal_rows(receiver.settings.journal)
    bad_keys = ["models/../../etc/config.json", "/etc/config.json", "org/m\nINFO forged/config.json"]
    answers = []
    for key in bad_keys:
        answers.append(httpx.post(f"{url}/v1/events/s3", headers=S3_AUTH, json={
            "Records": [s3_record("models", quote_plus("org/ok/config.json")),
                        s3_record("models", quote_plus(key))]}))  # one bad record spoils the body
        answers.append(httpx.post(f"{url}/v1/events/s3", headers=S3_AUTH, json={
            "detail-type": "Object Created", "source": "aws.s3",
            "detail": {"bucket": {"name": "models"}, "object": {"key": key}}}))
        answers.append(httpx.post(f"{url}/v1/events/seaweedfs", json=filer_event(f"/buckets/models/{key}"),
                                  headers={"Authorization": f"Bearer {SECRETS['seaweedfs_token']}"}))
    hub = {"event": {"action": "update", "scope": "repo.content"},
           "repo": {"type": "model", "name": "acme/../../etc", "headSha": "a" * 40}}
    answers.append(httpx.post(f"{url}/v1/webhooks/release", json=hub,
                              headers={"X-Webhook-Secret": SECRETS["hf_webhook"]}))
    for model, source in [("hard/etc", "/etc"), ("hard/file", "file:///etc/passwd"),
                          ("hard/imds", "http://169.254.169.254/latest/meta-data/"),
                          ("hard/dotdot", "s3://models/../secrets"),
                          ("hard/other", "s3://other-bucket/m"), ("../../etc", None),
                          ("hard/trust", None)]:
        extra = {"trust_remote_code": True} if model == "hard/trust" else {}
        answers.append(post_release(url, release(model, source, **extra)))
    # more keys than limits.max_json_keys: 413 before the body is parsed
    answers.append(httpx.post(f"{url}/v1/events/s3", headers=S3_AUTH,
                              content=json.dumps({"Records": [], "x": ":" * 20_000}).encode()))
    codes = [a.status_code for a in answers]
    assert codes == [422] * (len(answers) - 1) + [413], [(a.status_code, a.text) for a in answers]
    assert all("\n" not in a.json()["detail"] for a in answers)
    assert journal_rows(receiver.settings.journal) == before  # nothing journaled


def test_content_length_with_transfer_encoding_is_400_and_closed(receiver):
    body = json.dumps(release("hard/smuggle")).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = "".join(f"{k}: {v}\r\n" for k, v in sign(SECRETS["release_hmac"], body).items())
    request = (f"POST /v1/webhooks/release HTTP/1.1\r\nHost: x\r\n{head}Content-Length: 4\r\n"
               f"Transfer-Encoding: chunked\r\n\r\n").encode() + chunked
    before = journal_rows(receiver.settings.journal)
    with socket.create_connection(("127.0.0.1", receiver.settings.port), timeout=10) as sock:
        sock.sendall(request + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # must not be served
        answer = read_until_closed(sock, 10)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"Content-Length and Transfer-Encoding" in answer
    assert answer.count(b"HTTP/1.1 ") == 1  # closed after the 400: the tail is never a request
    assert journal_rows(receiver.settings.journal) == before


HEAD = b"POST /v1/webhooks/release HTTP/1.1\r\nHost: x\r\n"


def _slow_start(kind: str) -> tuple[bytes, bytes]:
    """(first bytes, bytes trickled every tick) of one kind of slow client."""
    if kind == "idle":
        return b"", b""
    if kind == "head":
        return HEAD, b"X-Slow: 1\r\n"
    # body_auth: the body is read (token checked from the headers); body_unauth: 401 from the
    # headers alone, then the client keeps trickling the body it announced
    auth = f"Authorization: Bearer {SECRETS['s3_token']}\r\n" if kind == "body_auth" else ""
    return (b"POST /v1/events/s3 HTTP/1.1\r\nHost: x\r\n%sContent-Length: 10000\r\n\r\n{"
            % auth.encode(), b" ")


def test_slowloris_connections_are_closed_while_releases_are_accepted(deployment, tmp_path):
    timeout_s = 2.0
    settings = receiver_settings(tmp_path, deployment, limits={
        "header_timeout_s": timeout_s, "body_timeout_s": timeout_s})
    kinds = ("idle", "head", "body_auth", "body_unauth")
    with ReceiverThread(settings) as rec:
        conns = []
        for i in range(200):
            kind = kinds[i % len(kinds)]
            first, tick = _slow_start(kind)
            sock = socket.create_connection(("127.0.0.1", settings.port), timeout=10)
            sock.sendall(first)
            sock.setblocking(False)
            conns.append({"sock": sock, "kind": kind, "tick": tick, "opened": time.monotonic(),
                          "closed": None, "data": b""})
        # the attack is on: a valid release still gets through
        resp = post_release(rec.url, release("hard/during-slowloris"))
        assert resp.status_code == 202, resp.text
        deadline = time.monotonic() + timeout_s + 30  # only a bound on this loop
        while time.monotonic() < deadline and any(c["closed"] is None for c in conns):
            for c in conns:
                if c["closed"] is not None:
                    continue
                # read before writing, and stop writing once answered: a byte sent after the
                # server's 408 and close is answered with a reset, which can drop the unread 408
                try:
                    while chunk := c["sock"].recv(65536):
                        c["data"] += chunk
                    c["closed"] = time.monotonic()  # recv returned b"": closed by the server
                    continue
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:  # reset: closed by the server
                    c["closed"] = time.monotonic()
                    continue
                if c["tick"] and not c["data"]:
                    try:
                        c["sock"].send(c["tick"])
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:  # reset or broken pipe: closed by the server
                        c["closed"] = time.monotonic()
            time.sleep(0.25)
        for c in conns:
            c["sock"].close()
        still_open = [c["kind"] for c in conns if c["closed"] is None]
        assert not still_open, f"{len(still_open)} slow connections never closed: {set(still_open)}"
        held = sorted(c["closed"] - c["opened"] for c in conns)
        # closed by the read deadline, not before it; the margin absorbs a busy machine
        assert held[0] >= timeout_s * 0.9 and held[-1] <= timeout_s + 10, (held[0], held[-1])
        for c in conns:
            if c["kind"] in ("idle", "head"):
                assert c["data"].startswith(b"HTTP/1.1 408 "), (c["kind"], c["data"][:100])
            elif c["kind"] == "body_unauth":  # answered 401 at once, then held to the deadline
                assert c["data"].startswith(b"HTTP/1.1 401 "), c["data"][:100]
        assert post_release(rec.url, release("hard/after-slowloris")).status_code == 202
        settled(rec.url)
    assert runs(deployment, "day0:hard/").keys() >= {
        "day0:hard/during-slowloris@0123abcd:cpu-bf16", "day0:hard/after-slowloris@0123abcd:cpu-bf16"}


def test_connection_cap_answers_503_until_slow_clients_are_gone(deployment, tmp_path):
    settings = receiver_settings(tmp_path, deployment, limits={
        "header_timeout_s": 2.0, "max_connections": 8})
    with ReceiverThread(settings) as rec:
        idle = [socket.create_connection(("127.0.0.1", settings.port), timeout=10) for _ in range(10)]
        try:
            assert post_release(rec.url, release("hard/capped")).status_code == 503
            for sock in idle:  # the header deadline frees the slots
                assert read_until_closed(sock, 20).startswith(b"HTTP/1.1 408 ")
        finally:
            for sock in idle:
                sock.close()
        assert post_release(rec.url, release("hard/capped")).status_code == 202


class BlackHole:
    """A loopback 'store' that accepts connections and never answers."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stop.is_set() and len(self.held) < 1000:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self):
        self.stop.set()
        self.thread.join(5)
        for s in [*self.held, self.sock]:
            s.close()


def test_black_hole_store_delays_only_what_needs_it(deployment, tmp_path):
    hole = BlackHole()
    try:
        settings = receiver_settings(
            tmp_path, deployment,
            s3={"endpoint_url": f"http://127.0.0.1:{hole.port}", "region": "us-east-1",
                "access_key_id": "k", "secret_access_key": "s", "request_timeout_s": 1,
                "max_attempts": 1},
            checks={"concurrency": 2, "timeout_s": 2.0, "inline_wait_s": 1.0, "queue": 4})
        with ReceiverThread(settings) as rec:
            records = [s3_record("models", f"bh/m{i}/config.json") for i in range(10)]
            for _ in range(2):  # more prefixes than threads and queue together
                resp = httpx.post(f"{rec.url}/v1/events/s3", headers=S3_AUTH,
                                  json={"Records": records}, timeout=30)
                assert resp.status_code == 202 and resp.json()["status"] == "recorded", resp.text
                assert {p["state"] for p in resp.json()["prefixes"]} == {"recorded"}
            accepted = time.monotonic()
            assert post_release(rec.url, release("hard/black-hole")).status_code == 202
            key = "day0:hard/black-hole@0123abcd:cpu-bf16"
            assert wait_until(lambda: runs(deployment, key).get(key) == 1, timeout_s=5,
                              interval_s=0.25), "signed release waited for the store"
            assert time.monotonic() - accepted <= 5

            def store_state():
                health = httpx.get(f"{rec.url}/healthz", headers=ADMIN, timeout=10).json()
                return health if health["store"]["state"] == "degraded" else None

            health = wait_until(store_state, timeout_s=20, interval_s=0.25)
            assert health, "store never reported degraded"
            assert health["status"] == "degraded" and health["worker_alive"] is True
            assert health["journal"]["prefixes"]["unchecked"] == 10  # still due, none lost
            # while degraded an event is journaled and answered without waiting for the store
            resp = httpx.post(f"{rec.url}/v1/events/s3", headers=S3_AUTH, timeout=30,
                              json={"Records": [s3_record("models", "bh/late/config.json")]})
            assert resp.status_code == 202 and "check pending" in resp.json()["detail"]
    finally:
        hole.close()


def test_client_disconnect_and_forged_lines_cost_one_log_line_each(deployment, tmp_path):
    config = write_config(tmp_path / "receiver.yaml", {
        "journal": str(tmp_path / "journal.sqlite"), "deployment": deployment.name,
        "prefect_api_url": deployment.api_url, "secrets": SECRETS, "submit": FAST_SUBMIT})
    log = tmp_path / "receiver.log"
    with ReceiverProcess(config, log=log, admin_token=SECRETS["admin_token"]) as proc:
        def lines() -> list[str]:
            return log.read_text(errors="replace").splitlines()

        for attempt in range(3):  # an unauthenticated sender drops the connection mid-body
            mark = len(lines())
            body = json.dumps(release("hard/dropped")).encode()
            with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as sock:
                sock.sendall(b"POST /v1/webhooks/release HTTP/1.1\r\nHost: x\r\n"
                             b"X-Day0-Signature: sha256=00\r\nX-Day0-Timestamp: 1\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body) + 500, body))
            assert wait_until(lambda: len(lines()) > mark, timeout_s=10), proc.log_tail()
            time.sleep(0.5)  # anything more it would write (a traceback) comes with it
            new = lines()[mark:]
            assert len(new) == 1 and "went away" in new[0], new
        # a newline in a value from a sender cannot forge a log line
        mark = len(lines())
        arn = "arn:aws:sns:us-east-1:1:t\n2030-01-01 00:00:00,000 INFO day0.receiver: forged"
        note = {"Type": "SubscriptionConfirmation", "TopicArn": arn, "Token": "t",
                "SubscribeURL": "https://sns.evil.example/?x=1\r\nINFO also forged"}
        resp = httpx.post(f"{proc.url}/v1/events/s3", headers=S3_AUTH, json=note, timeout=10)
        assert resp.status_code == 202 and resp.json()["status"] == "unconfirmed"
        assert wait_until(lambda: len(lines()) > mark, timeout_s=10)
        time.sleep(0.5)
        new = lines()[mark:]
        assert len(new) == 1 and "t\\x0a2030-01-01" in new[0] and "\\x0d\\x0aINFO" in new[0], new


def test_trust_remote_code_comes_only_from_the_receiver_config(deployment, tmp_path):
    settings = receiver_settings(tmp_path, deployment, trust_remote_code=["s3://models/trusted"])
    with ReceiverThread(settings) as rec:
        for model in ("trusted/m1", "trusted-not/m1", "other/m1"):
            resp = post_release(rec.url, release(f"hard-trc/{model}", f"s3://models/{model}"))
            assert resp.status_code == 202, resp.text
        asked = post_release(rec.url, release("hard-trc/asks", trust_remote_code=True))
        assert asked.status_code == 422 and "trust_remote_code" in asked.json()["detail"]
        settled(rec.url)
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterIdempotencyKey

    keys = [f"day0:hard-trc/{m}@0123abcd:cpu-bf16" for m in ("trusted/m1", "trusted-not/m1", "other/m1")]
    with get_client(sync_client=True) as client:
        found = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            idempotency_key=FlowRunFilterIdempotencyKey(any_=keys)))
    params = {r.idempotency_key: r.parameters.get("trust_remote_code") for r in found}
    assert params == {keys[0]: True, keys[1]: None, keys[2]: None}
