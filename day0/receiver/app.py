"""The HTTP surface of the receiver (FastAPI). `create_app(settings)` builds it.

Order of work for every POST: authenticate what can be authenticated from the headers -> refuse
bodies over max_body_bytes (413, before reading more) -> verify body signatures -> bound the JSON
(413 over limits.max_json_keys) -> parse JSON (400) -> validate the schema and every name (422)
-> name the release (a signed release without a revision gets the one a manual run of its
s3:// source computes, day0.store.identity, asked of the store on the check pool within
checks.timeout_s) -> write the journal durably -> answer 2xx -> wake the worker. Bad input is
always a 4xx with {"detail": reason} (409: a release without a revision whose source holds no
complete checkpoint yet); 5xx only means the receiver or what it depends on is in trouble
(journal unwritable or store unable to name a release: 503 with Retry-After, SNS confirmation
call failed: 502). A client that goes away mid-request costs one log line.
Connection-level limits (read deadlines, CL+TE, connection cap) are in day0.receiver.server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import ipaddress
import logging
import posixpath
import time
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from day0.errors import (AuthError, BadRequest, ClientGone, JournalError, ReceiverError,
                         StoreError, TooLarge, Unavailable)
from day0.receiver import auth
from day0.receiver.checks import CheckRunner, StoreProbe
from day0.receiver.completeness import Checker, make_client, included, model_of, relevant
from day0.receiver.events import (ObjectEvent, Release, parse_hf, parse_json, parse_release,
                                  parse_s3, parse_seaweedfs)
from day0.receiver.journal import Journal, ReleaseRow
from day0.receiver.safety import EscapeFilter
from day0.receiver.server import FramingGuard, uvicorn_config
from day0.receiver.settings import ReceiverSettings, secret
from day0.receiver.submit import Worker, watch
from day0.store.retry import probe, settings as store_settings
from day0.store.s3 import is_s3, parse_s3_uri

log = logging.getLogger("day0.receiver")
log.addFilter(EscapeFilter())  # keys, names and store errors come from outside
DRAIN_FACTOR = 4

async def read_body(request: Request, limit: int) -> bytes:
    """The body, or TooLarge once Content-Length or the bytes read pass `limit`.

    Nothing over the limit is kept or parsed. A moderately oversized body is read to its end
    and dropped so that the sender, still writing, sees the 413 instead of a reset connection;
    past DRAIN_FACTOR x limit the answer goes out at once and the connection is closed.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(400, "invalid Content-Length")
        if int(declared) > limit * DRAIN_FACTOR:
            raise TooLarge(f"body larger than {limit} bytes")
    chunks, total = [], 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit * DRAIN_FACTOR:
                raise TooLarge(f"body larger than {limit} bytes")
            if total <= limit:
                chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone("incomplete body") from None
    if total > limit:
        raise TooLarge(f"body larger than {limit} bytes")
    return b"".join(chunks)


def _reply(code: int, **body: Any) -> JSONResponse:
    return JSONResponse(body, status_code=code)


def _peer(request: Request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client else "?"


def _ignored(request: Request, reason: str) -> JSONResponse:
    """200 'ignored', logged with the reason (the path never holds a ?token= query)."""
    log.info("ignored %s %s from %s: %s", request.method, request.url.path, _peer(request), reason)
    return _reply(200, status="ignored", reason=reason)


def _allowed_targets(settings: ReceiverSettings) -> set[str]:
    if settings.allowed_targets is not None:
        return set(settings.allowed_targets)
    from day0.execution.targets import available_targets

    return set(available_targets()) | set(settings.targets)


class Receiver:
    """State shared by the handlers: settings, journal, checker, worker."""

    def __init__(self, settings: ReceiverSettings, client_factory=None):
        self.settings = settings
        self.journal = Journal(settings.journal)
        self.targets_allowed = _allowed_targets(settings)
        factory = client_factory or (lambda: make_client(settings.s3))
        self.checker = Checker(self.journal, factory, settings.checkpoint, settings.targets)
        # store calls get their own bounded threads: a slow store must not delay anything else
        self.runner = CheckRunner(self.checker, settings.checks)
        self.probe = StoreProbe(lambda: _probe_store(settings), store_settings().probe.cache_s)
        self.worker = Worker(self.journal, self.runner, settings)
        self.runner.on_done(self.worker.wake)

    # ---- releases ------------------------------------------------------------------------

    async def accept(self, releases: list[Release]) -> JSONResponse:
        rows = []
        for rel in releases:
            targets = rel.targets or tuple(self.settings.targets)
            unknown = sorted(set(targets) - self.targets_allowed)
            if unknown:
                raise BadRequest(422, f"targets: unknown target(s) {unknown}; allowed: "
                                      f"{sorted(self.targets_allowed)}")
            rel = await self.named(rel)
            rows += [ReleaseRow(model=rel.model, revision=rel.revision, target=t, source=rel.source,
                                origin=rel.origin) for t in targets]
        fresh = await asyncio.to_thread(self.journal.accept, rows)
        for row, new in zip(rows, fresh):
            log.info("release %s@%s on %s (%s): %s", row.model, row.revision, row.target, row.origin,
                     "accepted" if new else "duplicate of a pending or running one")
        if any(fresh):
            self.worker.wake()
        listed = [{"model": r.model, "revision": r.revision, "target": r.target,
                   "new": new} for r, new in zip(rows, fresh)]
        if any(fresh):
            return _reply(202, status="accepted", releases=listed)
        return _reply(200, status="duplicate", releases=listed)

    async def named(self, rel: Release) -> Release:
        """rel with a revision: one that gives none gets the listing revision of its s3://
        source (day0.store.identity: what `day0 validate` of that source names it), from a
        completeness check on the check pool that journals nothing."""
        if rel.revision is not None:
            return rel
        if not is_s3(rel.source):
            raise BadRequest(422, "revision: required for a folder source (only an s3:// "
                                  "source is named from its listing)")
        u = parse_s3_uri(rel.source)
        fut = self.runner.lookup(u.bucket, u.key)
        if fut is None:
            raise Unavailable("store checks queue full")
        timeout = self.settings.checks.timeout_s
        done, _ = await asyncio.wait([watch(fut)], timeout=timeout)
        if not done:
            self.runner.timed_out(u.bucket, u.key)
            raise Unavailable(f"store check took longer than {timeout:g} s")
        exc = StoreError("check cancelled") if fut.cancelled() else fut.exception()
        if exc is not None:
            if not isinstance(exc, StoreError):
                log.error("naming %s failed: %s: %s", rel.source, type(exc).__name__, exc)
            raise Unavailable(f"cannot read the store: {str(exc) or type(exc).__name__}")
        result = fut.result()
        if not result.complete:
            raise BadRequest(409, f"source {rel.source[:200]!r} holds no complete checkpoint "
                                  f"yet ({result.detail}): announce it once uploaded, or give "
                                  "its revision")
        return dataclasses.replace(rel, revision=result.revision)

    # ---- object-store events -------------------------------------------------------------

    async def objects(self, events: list[ObjectEvent]) -> JSONResponse:
        rules, checks = self.settings.checkpoint, self.settings.checks
        rows = list(dict.fromkeys((ev.bucket, posixpath.dirname(ev.key)) for ev in events
                                  if relevant(ev.bucket, ev.key, rules)))
        others = list(dict.fromkeys((ev.bucket, posixpath.dirname(ev.key)) for ev in events
                                    if included(ev.bucket, ev.key, rules)))
        others = [o for o in others if o not in rows]
        touched = await asyncio.to_thread(self.journal.touch_pending, others, rules.settle_s) \
            if others and rules.settle_s > 0 else []
        if touched and not rows:  # a release still to come waits for this upload to end
            detail = f"another file landed: settling for {rules.settle_s:g} s (checkpoint.settle_s)"
            log.info("s3://%s/%s %s", *touched[0], detail)
            self.worker.wake()
            return _reply(202, status="settling", detail=detail, prefixes=[
                {"model": model_of(b, p), "state": "settling", "detail": detail} for b, p in touched])
        if not rows:
            reason = "no checkpoint file (config.json, index, *.safetensors) in the event"
            log.info("ignored object event (s3://%s/%s%s): %s", events[0].bucket, events[0].key,
                     f" and {len(events) - 1} more" if len(events) > 1 else "", reason)
            return _reply(200, status="ignored", reason=reason)
        most = self.settings.limits.max_prefixes_per_event
        if len(rows) > most:
            raise BadRequest(422, f"event names {len(rows)} checkpoint prefixes; at most {most} "
                                  "(limits.max_prefixes_per_event)")
        generations = await asyncio.to_thread(self.journal.record_objects, rows)
        # all prefixes are checked at once, under one deadline for the whole request; while the
        # store is degraded the answer does not wait for it at all
        degraded = self.runner.report()["state"] == "degraded"
        futures = {key: self.runner.submit(*key, gen) for key, gen in generations.items()}
        waiting = [watch(f) for f in futures.values() if f is not None]
        if waiting and not degraded and checks.inline_wait_s > 0:
            await asyncio.wait(waiting, timeout=checks.inline_wait_s)
        out, any_new = [], False
        for (bucket, prefix), gen in generations.items():
            model, fut = model_of(bucket, prefix), futures[(bucket, prefix)]
            state = fresh = None
            if fut is None:
                reason = "store checks queue full"
            elif not fut.done():
                reason = "store degraded" if degraded else "store check still running"
            elif fut.cancelled():
                reason = "store check cancelled"
            elif fut.exception() is not None:
                exc = fut.exception()
                if not isinstance(exc, StoreError):
                    log.error("completeness check of s3://%s/%s failed: %s: %s", bucket, prefix,
                              type(exc).__name__, exc)
                reason = str(exc) or type(exc).__name__
            else:
                state, fresh = fut.result()
                if state is not None and state.state == "settling":  # the check logged it
                    out.append({"model": model, "state": "settling", "detail": state.detail})
                    continue
                reason = "an earlier check is still running" if state is None or state.checked < gen else None
            if reason is not None:  # the worker checks again (with backoff on store errors)
                log.info("s3://%s/%s recorded, its check is pending: %s", bucket, prefix, reason)
                out.append({"model": model, "state": "recorded", "detail": f"check pending: {reason}"})
                continue
            any_new |= any(fresh)  # the check logged its outcome (completeness.Checker)
            out.append({"model": model, "state": state.state, "missing": state.missing,
                        "revision": state.revision, "detail": state.detail,
                        "new_releases": sum(fresh)})
        self.worker.wake()
        states = {o["state"] for o in out}
        status = ("accepted" if any_new else "complete" if states == {"complete"}
                  else "waiting" if "waiting" in states
                  else "settling" if "settling" in states else "recorded")
        detail = "; ".join(f"{o['model']}: {o['detail']}" for o in out)
        return _reply(202, status=status, detail=detail, prefixes=out)

    async def sns_control(self, sns) -> JSONResponse:
        if sns.Type == "SubscriptionConfirmation":
            return await self.confirm_subscription(sns)
        log.info("SNS %s for %s ignored", sns.Type, sns.TopicArn)
        return _reply(200, status="ignored", reason=f"SNS {sns.Type}")

    async def confirm_subscription(self, sns) -> JSONResponse:
        url = sns.SubscribeURL or ""
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").lower()
        except ValueError:  # e.g. an unbalanced IPv6 bracket
            return _reply(422, detail="SubscribeURL is not a URL")
        allowed = any(fnmatch.fnmatchcase(host, p.lower()) for p in self.settings.sns_allowed_hosts)
        secure = parts.scheme == "https" or (parts.scheme == "http" and _loopback(host))
        if not host or not allowed or not secure:
            why = (f"SubscribeURL host '{host}' is not in sns_allowed_hosts" if not allowed
                   else "SubscribeURL must be https")
            log.warning("SNS subscription to %s NOT confirmed (%s); confirm by hand: %s",
                        sns.TopicArn, why, url)
            return _reply(202, status="unconfirmed", reason=why)
        import httpx

        try:
            async with httpx.AsyncClient(timeout=10.0, follow_redirects=False) as client:
                resp = await client.get(url)
        except httpx.HTTPError as exc:
            return _reply(502, detail=f"SubscribeURL call failed: {type(exc).__name__}")
        if resp.status_code // 100 != 2:
            return _reply(502, detail=f"SubscribeURL answered {resp.status_code}")
        log.info("SNS subscription to %s confirmed", sns.TopicArn)
        return _reply(200, status="confirmed", topic=sns.TopicArn)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServerTiming:
    """ASGI middleware: 'Server-Timing: app;dur=<ms>' on every answer (time inside the receiver)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()

        async def timed_send(message):
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - started) * 1000
                message["headers"] = [*message.get("headers", []),
                                      (b"server-timing", f"app;dur={ms:.2f}".encode())]
            await send(message)

        await self.app(scope, receive, timed_send)


def create_app(settings: ReceiverSettings, client_factory=None) -> FastAPI:
    """The receiver app; the journal opens and the worker starts with the app's lifespan.

    `client_factory` returns the boto3 S3 client used for completeness checks (default: from
    settings.s3 / day0.store.s3).
    """
    app = FastAPI(title="day0 release receiver", lifespan=_lifespan(settings, client_factory),
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(ServerTiming)
    app.add_middleware(FramingGuard)  # added last: runs first, before any handler sees a body
    # the whole tree (day0.errors): status, reason, headers
    app.add_exception_handler(ReceiverError, _refused)
    _add_event_routes(app, settings)
    _add_health_route(app, settings)
    return app


def _lifespan(settings: ReceiverSettings, client_factory):
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        receiver = Receiver(settings, client_factory)
        app.state.receiver = receiver
        receiver.worker.start()
        log.info("receiver ready: journal %s, deployment %s", settings.journal, settings.deployment)
        try:
            yield
        finally:
            receiver.worker.stop()
            receiver.runner.shutdown()
            receiver.journal.close()

    return lifespan


async def _refused(request: Request, exc: ReceiverError) -> JSONResponse:
    if isinstance(exc, ClientGone):  # nobody is left to read the answer
        log.info("client %s went away before sending its whole body (%s %s); nothing "
                 "recorded", _peer(request), request.method, request.url.path)
    if isinstance(exc, JournalError):
        log.error("journal write failed: %s", exc.__cause__ or exc)
    if not isinstance(exc, ClientGone):  # reasons never hold a secret (day0.receiver.auth)
        log.warning("%s %s %s from %s: %d %s", "refused" if exc.status < 500 else "deferred",
                    request.method, request.url.path, _peer(request), exc.status, exc.reason)
    detail = f"retry later: {exc.reason}" if isinstance(exc, Unavailable) else exc.reason
    return JSONResponse({"detail": detail}, status_code=exc.status, headers=exc.headers)


def _receiver(request: Request) -> Receiver:
    return request.app.state.receiver


def _add_event_routes(app: FastAPI, settings: ReceiverSettings) -> None:
    """The POST routes: object-store events (S3/SNS, SeaweedFS) and release webhooks."""
    secrets = settings.secrets
    limit, max_keys = settings.max_body_bytes, settings.limits.max_json_keys

    @app.post("/v1/events/s3")
    async def s3_events(request: Request):
        auth.check_token(request.headers, request.query_params, secret(secrets.s3_token),
                         allow_query=True)
        data = parse_json(await read_body(request, limit), max_keys)
        payload = parse_s3(data, request.headers.get("x-amz-sns-message-type"))
        if payload.sns is not None and payload.sns.Type != "Notification":
            return await _receiver(request).sns_control(payload.sns)
        if payload.ignored:
            return _ignored(request, payload.ignored)
        return await _receiver(request).objects(payload.objects)

    @app.post("/v1/events/seaweedfs")
    async def seaweedfs_events(request: Request):
        auth.check_token(request.headers, {}, secret(secrets.seaweedfs_token))
        data = parse_json(await read_body(request, limit), max_keys)
        events, ignored = parse_seaweedfs(data, settings.checkpoint.seaweedfs_buckets_dir)
        if ignored:
            return _ignored(request, ignored)
        return await _receiver(request).objects(events)

    @app.post("/v1/webhooks/release")
    async def release_webhook(request: Request):
        headers = request.headers
        if auth.HF_SECRET_HEADER.lower() in headers:
            auth.check_shared_secret(headers.get(auth.HF_SECRET_HEADER), secret(secrets.hf_webhook),
                                     auth.HF_SECRET_HEADER)
            data = parse_json(await read_body(request, limit), max_keys)
            hub = settings.hub
            releases, ignored = parse_hf(data, hub.branches, hub.repo_types, hub.source)
            if ignored:
                return _ignored(request, ignored)
            return await _receiver(request).accept(releases)
        if auth.SIGNATURE_HEADER.lower() not in headers:
            raise AuthError(f"missing {auth.SIGNATURE_HEADER} (signed release) or "
                            f"{auth.HF_SECRET_HEADER} (Hugging Face Hub)")
        if secret(secrets.release_hmac) is None:
            raise AuthError("no release_hmac secret is configured")
        body = await read_body(request, limit)
        auth.check_signature(headers, body, secret(secrets.release_hmac), settings.replay_window_s)
        return await _receiver(request).accept(
            [parse_release(parse_json(body, max_keys), settings.release_sources)])


def _probe_store(settings: ReceiverSettings) -> str | None:
    """Why the receiver's store does not answer one brief request now; None when it does."""
    timeout = store_settings().probe.timeout_s
    brief = settings.s3.model_copy(update={"request_timeout_s": timeout, "max_attempts": 1})
    return probe(make_client(brief))


def _add_health_route(app: FastAPI, settings: ReceiverSettings) -> None:
    @app.get("/healthz")
    async def healthz(request: Request):
        rec = _receiver(request)
        # the store as it is now: a bounded probe (cached), not only the last check's outcome
        store = rec.runner.report(await asyncio.to_thread(rec.probe.result))
        healthy = rec.worker.alive and store["state"] != "degraded"
        status = "ok" if healthy else "degraded"
        try:
            auth.check_token(request.headers, {}, secret(settings.secrets.admin_token))
        except AuthError:
            if not settings.public_healthz:
                raise
            return _reply(200, status=status)
        stats = await asyncio.to_thread(rec.journal.stats)
        return _reply(200, status=status, worker_alive=rec.worker.alive, store=store,
                      submitted_by_this_process=rec.worker.submitted,
                      last_worker_error=rec.worker.last_error, journal=stats,
                      deployment=settings.deployment)


def serve(settings: ReceiverSettings) -> None:
    """Run the receiver with uvicorn until SIGINT/SIGTERM (``day0 hooks serve``)."""
    import uvicorn

    from day0.receiver.journal import hold_lock

    hold_lock(settings.journal)  # before serving: a second receiver on it exits with the reason
    # the receiver's own lines at INFO, libraries' at WARNING: httpx would log every request
    # of the Prefect client (its INFO lines are not events of the receiver)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("day0").setLevel(logging.INFO)
    uvicorn.Server(uvicorn_config(create_app(settings), settings)).run()
