"""Load generator for the receiver, shared by tests/receiver/test_load.py and bench/bench_receiver.py.

Deliveries are generic signed release webhooks of several classes (the class says what the
sender intended and which answer is correct):

    valid          first delivery of a unique release                 -> 202 (or 200 if a retry)
    duplicate      the same release again (same body, fresh signature) -> 200 (or 202 if first)
    bad_signature  signed with the wrong secret                       -> 401
    stale          correct signature, timestamp outside the window    -> 401
    malformed      not JSON                                           -> 400
    schema         JSON without required fields                       -> 422
    oversize       body over max_body_bytes                           -> 413

Senders behave like real webhook senders: a connection error (receiver down) is retried with
a fresh signature until an HTTP answer comes or a deadline passes. Latency is measured for the
request that got the answer.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from day0.receiver.auth import sign

EXPECTED = {"valid": {200, 202}, "duplicate": {200, 202}, "bad_signature": {401}, "stale": {401},
            "malformed": {400}, "schema": {422}, "oversize": {413}}
VALID = ("valid", "duplicate")


@dataclass
class Delivery:
    cls: str
    body: bytes
    release: tuple[str, str] | None = None
    secret: str = ""
    ts_offset: int = 0
    status: int | None = None
    latency_s: float | None = None
    server_ms: float | None = None
    attempts: int = 0
    error: str | None = None

    def headers(self) -> dict[str, str]:
        return sign(self.secret, self.body, int(time.time()) + self.ts_offset)


def make_deliveries(total: int, unique: int, secret: str, *, prefix: str = "load", seed: int = 0,
                    max_body: int = 1 << 20, source: str = "s3://models/nonexistent",
                    shares: dict[str, float] | None = None) -> list[Delivery]:
    """`unique` valid releases, each delivered at least once, padded to `total` with the mix."""
    rng = random.Random(seed)
    shares = shares or {"duplicate": 0.45, "bad_signature": 0.12, "stale": 0.06, "malformed": 0.08,
                        "schema": 0.06, "oversize": 0.03}
    if total < unique:
        raise ValueError("total must be >= unique")
    releases = [(f"{prefix}/model-{i:04d}", f"{rng.getrandbits(64):016x}") for i in range(unique)]

    def body(rel):
        return json.dumps({"model": rel[0], "revision": rel[1], "source": source}).encode()

    out = [Delivery("valid", body(r), r, secret) for r in releases]
    classes, weights = zip(*shares.items())
    for cls in rng.choices(classes, weights, k=total - unique):
        rel = rng.choice(releases)
        if cls == "duplicate":
            out.append(Delivery(cls, body(rel), rel, secret))
        elif cls == "bad_signature":
            out.append(Delivery(cls, body(rel), None, secret + "-wrong"))
        elif cls == "stale":
            out.append(Delivery(cls, body(rel), None, secret, ts_offset=-(3600 + rng.randrange(1000))))
        elif cls == "malformed":
            out.append(Delivery(cls, body(rel)[: rng.randrange(1, 20)] + b"\x00{", None, secret))
        elif cls == "schema":
            out.append(Delivery(cls, json.dumps({"model": rel[0]}).encode(), None, secret))
        elif cls == "oversize":
            out.append(Delivery(cls, b'{"model": "' + b"x" * (max_body + 10) + b'"}', None, secret))
    rng.shuffle(out)
    # the class follows the order the sender sends in: the first delivery of a release is "valid"
    seen: set = set()
    for d in out:
        if d.release is not None:
            d.cls = "duplicate" if d.release in seen else "valid"
            seen.add(d.release)
    return out


class _Conn:
    """A minimal HTTP/1.1 keep-alive client over asyncio streams.

    httpx spends ~3 ms of CPU per request at 50 concurrent senders, more than the receiver
    itself, which on a 2-core machine would make the client the thing being measured.
    """

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str], timeout: float
                   ) -> tuple[int, dict[str, str]]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), timeout)
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
        try:
            self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await self.writer.drain()
            return await asyncio.wait_for(self._response(), timeout)
        except BaseException:
            self.close()
            raise

    async def _response(self) -> tuple[int, dict[str, str]]:
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionResetError("connection closed")
        status = int(status_line.split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        await self.reader.readexactly(int(headers.get("content-length", 0)))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def send_all(url: str, deliveries: list[Delivery], concurrency: int = 50,
                   deadline_s: float = 120.0, on_done=None) -> None:
    """POST every delivery (bounded concurrency, bounded total time); fills status/latency."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    queue: asyncio.Queue = asyncio.Queue()
    for d in deliveries:
        queue.put_nowait(d)
    stop_at = time.monotonic() + deadline_s
    done = 0

    async def one(conn: _Conn, d: Delivery) -> None:
        while time.monotonic() < stop_at:
            d.attempts += 1
            started = time.perf_counter()
            try:
                status, headers = await conn.post("/v1/webhooks/release", d.body, d.headers(), 30.0)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError,
                    IndexError) as exc:  # receiver down or connection cut: retry like a sender
                d.error = type(exc).__name__
                await asyncio.sleep(0.2)
                continue
            d.status, d.latency_s = status, time.perf_counter() - started
            timing = headers.get("server-timing", "")
            if "dur=" in timing:
                d.server_ms = float(timing.split("dur=")[1].split(",")[0])
            return

    async def worker() -> None:
        nonlocal done
        conn = _Conn(parts.hostname, parts.port)
        try:
            while True:
                try:
                    d = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await one(conn, d)
                done += 1
                if on_done is not None:
                    await on_done(done)
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


@dataclass
class Summary:
    by_class: Counter = field(default_factory=Counter)
    by_status: Counter = field(default_factory=Counter)
    wrong: list[tuple[str, int | None]] = field(default_factory=list)
    acknowledged: set = field(default_factory=set)
    unique_valid: set = field(default_factory=set)
    latencies: list[float] = field(default_factory=list)
    server_ms: list[float] = field(default_factory=list)
    retried: int = 0

    def percentile(self, q: float, server: bool = False) -> float:
        """Latency quantile of acknowledged requests, seconds (server=True: inside the receiver)."""
        xs = sorted(x / 1000 for x in self.server_ms) if server else sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summarize(deliveries: list[Delivery]) -> Summary:
    s = Summary()
    for d in deliveries:
        s.by_class[d.cls] += 1
        s.by_status[d.status] += 1
        s.retried += d.attempts > 1
        if d.status not in EXPECTED[d.cls]:
            s.wrong.append((d.cls, d.status))
        if d.release is not None:
            s.unique_valid.add(d.release)
            if d.status in (200, 202):
                s.acknowledged.add(d.release)
        if d.status is not None and 200 <= d.status < 300:
            s.latencies.append(d.latency_s)
            if d.server_ms is not None:
                s.server_ms.append(d.server_ms)
    return s


def flow_run_keys(deployment_id, key_prefix: str) -> Counter:
    """Idempotency keys of the deployment's flow runs that start with key_prefix (all pages)."""
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    keys: Counter = Counter()
    with get_client(sync_client=True) as client:
        offset = 0
        while True:
            page = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                limit=200, offset=offset)
            keys.update(r.idempotency_key for r in page
                        if r.idempotency_key and r.idempotency_key.startswith(key_prefix))
            if len(page) < 200:
                return keys
            offset += 200


def wait_drained(url: str, admin_token: str, timeout_s: float = 60.0) -> dict:
    """Poll /healthz until no release is pending; returns the last journal statistics."""
    deadline = time.monotonic() + timeout_s
    stats: dict = {}
    while time.monotonic() < deadline:
        try:
            stats = httpx.get(f"{url}/healthz", headers={"Authorization": f"Bearer {admin_token}"},
                              timeout=5).json()["journal"]
            if stats["releases"]["pending"] == 0 and stats["prefixes"]["unchecked"] == 0:
                return stats
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.2)
    return stats
