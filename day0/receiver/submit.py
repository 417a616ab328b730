"""Background worker: accepted releases -> Prefect flow runs; unchecked prefixes -> checks.

It runs in its own thread with its own event loop, so HTTP handlers only write the journal and
wake it. On start it finds whatever the journal holds as pending (a previous process may have
been killed between accepting and submitting) and submits it. Store checks of due prefixes
run on the CheckRunner's own threads and are only watched from here, each with a deadline
(checks.timeout_s), so a store that never answers cannot hold up the submission of releases.
Each submission is ``run_deployment(..., timeout=0, idempotency_key=day0.store.identity.dedupe_key(
model, revision, target, seq))`` with the parameters of day0.request.ValidateRequest (model and
revision included, so the run publishes under the receiver's name for the release): if a crash
came after Prefect created the run but before the journal recorded it, the resubmission returns
the same flow run instead of creating a second one. Failures back off exponentially (capped) and
are retried for as long as the receiver runs; nothing accepted is ever dropped. At most every
submit.poll_s the worker reads the state of submitted runs (REAP_BATCH at a time) and marks
those that ended finished in the journal: a later announcement of the same release starts a new
run (day0.receiver.journal).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import threading
import time
import uuid

from concurrent.futures import Future

from day0.orchestration import submit as prefect
from day0.receiver.checks import CheckRunner
from day0.receiver.journal import Journal, ReleaseRow
from day0.receiver.safety import under
from day0.receiver.settings import ReceiverSettings
from day0.request import ValidateRequest

log = logging.getLogger("day0.receiver")
EVENT_NAMESPACE = uuid.UUID("6f1d7a5e-3c0b-4b8e-9d39-0da7f5a1c0de")
REAP_BATCH = 200  # flow runs read per pass (Prefect's default page size)


def watch(fut: Future) -> asyncio.Future:
    """An awaitable for a check's future; its outcome is read from `fut`, so the awaitable's
    own copy of an exception is marked retrieved (no 'never retrieved' noise when unawaited)."""
    waiter = asyncio.wrap_future(fut)
    waiter.add_done_callback(lambda w: w.cancelled() or w.exception())
    return waiter


def backoff(attempt: int, initial: float, cap: float) -> float:
    """Exponential delay with +-20 % jitter so many pending releases do not retry in lockstep."""
    return min(cap, initial * (2 ** min(attempt, 30))) * random.uniform(0.8, 1.2)


class Worker:
    def __init__(self, journal: Journal, runner: CheckRunner | None, settings: ReceiverSettings):
        self.journal, self.runner, self.settings = journal, runner, settings
        self._checking: set[tuple[str, str]] = set()  # prefixes whose check is watched here
        self._watchers: set[asyncio.Task] = set()  # strong references until they end
        self._context = contextvars.copy_context()  # inherit Prefect settings of the creator
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._inflight: set[int] = set()
        self._next_reap = 0.0  # time.monotonic() of the next read of submitted runs' states
        self._reap_after = 0  # journal id the next read starts after (round robin)
        self._publishing: asyncio.Future | None = None  # ERROR verdicts of given-up releases
        self.submitted = 0
        self.last_error: str | None = None

    # ---- lifecycle (called from any thread) ----------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._context.run, args=(self._main,),
                                        name="day0-receiver-worker", daemon=True)
        self._thread.start()
        self._ready.wait(30)

    def wake(self) -> None:
        if self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed at shutdown
                self._loop.call_soon_threadsafe(self._wake.set)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- the loop ------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            with prefect.api_url(self.settings.prefect_api_url, csrf=self.settings.prefect_csrf):
                asyncio.run(self._run())
        except Exception as exc:  # shows as worker_alive false / degraded in /healthz
            log.exception("receiver worker stopped")
            self.last_error = f"{type(exc).__name__}: {exc}"
        finally:
            self._ready.set()

    async def _run(self) -> None:
        prefect.preload()  # Prefect's client side now, not under the first request's load
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        limit = asyncio.Semaphore(self.settings.submit.concurrency)
        tasks: set[asyncio.Task] = set()
        async with prefect.client() as client:
            self._ready.set()
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    await self._check_prefixes()
                    await self._reap(client)
                    for row in await asyncio.to_thread(self.journal.due_releases, 200):
                        if row.id in self._inflight:
                            continue
                        self._inflight.add(row.id)
                        task = asyncio.create_task(self._submit(client, row, limit))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    delay = await asyncio.to_thread(self._idle_delay)
                except Exception as exc:  # journal trouble: keep the worker alive, try again
                    log.exception("receiver worker pass failed")
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    delay = self.settings.submit.poll_s
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=delay)
            if tasks:  # pending events are flushed by Prefect's own exit handler
                await asyncio.wait(tasks, timeout=10)

    def _idle_delay(self) -> float:
        # 0 means "due now": rows in flight or just recorded, whose owners call wake() anyway
        due = [self.journal.next_release_due()]
        if not self._checking:  # while checks run, their ends wake the loop (no polling)
            due.append(self.journal.next_check_due())
        due = [t for t in due if t]
        delay = self.settings.submit.poll_s
        if due:
            delay = min(delay, max(0.05, min(due) - time.time()))
        return delay

    async def _check_prefixes(self) -> None:
        """Start (or watch) the check of each due prefix, as many as the runner has room for."""
        room = self.runner.capacity() if self.runner is not None else 0
        if room <= 0:
            return
        for bucket, prefix, failures in await asyncio.to_thread(self.journal.due_prefixes, None, room):
            if (bucket, prefix) in self._checking:
                continue
            state = await asyncio.to_thread(self.journal.prefix, bucket, prefix)
            fut = self.runner.submit(bucket, prefix, state.generation)
            if fut is None:  # queue full: the next pass
                break
            self._checking.add((bucket, prefix))
            task = asyncio.create_task(self._watch_check(bucket, prefix, failures, fut))
            self._watchers.add(task)
            task.add_done_callback(self._watchers.discard)

    async def _watch_check(self, bucket: str, prefix: str, failures: int, fut: Future) -> None:
        try:
            done, _ = await asyncio.wait([watch(fut)], timeout=self.settings.checks.timeout_s)
            if not done:
                self.runner.timed_out(bucket, prefix)
                error = f"store check took longer than {self.settings.checks.timeout_s:g} s"
            elif fut.cancelled() or fut.exception() is None:
                return
            else:
                exc = fut.exception()
                error = f"{type(exc).__name__}: {exc}"
            delay = backoff(failures, self.settings.submit.backoff_initial_s,
                            self.settings.submit.backoff_max_s)
            log.warning("store check of s3://%s/%s failed (retry in %.0f s): %s",
                        bucket, prefix, delay, error)
            await asyncio.to_thread(self.journal.defer_check, bucket, prefix, delay, error)
        except Exception as exc:  # journal trouble: the prefix stays due
            self.last_error = f"{type(exc).__name__}: {exc}"
        finally:
            self._checking.discard((bucket, prefix))
            self.wake()

    async def _reap(self, client) -> None:
        """Mark releases whose flow run reached a final state (or vanished) finished, at most
        every submit.poll_s; a Prefect that cannot answer now is asked on a later pass."""
        if time.monotonic() < self._next_reap:
            return
        self._next_reap = time.monotonic() + self.settings.submit.poll_s
        self._publish_given_up()  # those the last pass (or a receiver before a restart) gave up on
        rows = await asyncio.to_thread(self.journal.active_runs, REAP_BATCH, self._reap_after)
        self._reap_after = rows[-1][0] if len(rows) == REAP_BATCH else 0
        ids = {}
        for release_id, run_id in rows:
            with contextlib.suppress(TypeError, ValueError):
                ids[uuid.UUID(run_id)] = release_id
        if not ids:
            return
        try:
            ended = await prefect.ended(client, list(ids))
        except Exception as exc:
            log.warning("reading the state of %d submitted runs failed: %s", len(ids), exc)
            return
        if ended:
            crashed = {ids[run_id]: why for run_id, (_, why) in ended.items() if why is not None}
            for run_id, (_, why) in ended.items():
                if why is not None:
                    log.warning("flow run %s crashed (%s): its release is run again, at most %d "
                                "attempts in all", run_id, why, self.settings.submit.crash_attempts)
            added = await asyncio.to_thread(
                self.journal.finish_runs, {ids[run_id]: end for run_id, (end, _) in ended.items()},
                crashed, self.settings.submit.crash_attempts)
            if added:
                log.info("%d release(s) run again (a crashed run, or announced after its run "
                         "ended)", added)
            for row in await asyncio.to_thread(self.journal.gave_up, list(crashed)):
                log.error("release %s@%s on %s: %s", row["model"], row["revision"],
                          row["target"], row["last_error"])

    def _publish_given_up(self) -> None:
        """Publish the ERROR verdict of each release given up on (also those a restart left),
        on a thread of its own: the store's retries never hold up submissions."""
        if self._publishing is not None and not self._publishing.done():
            return
        self._publishing = asyncio.create_task(asyncio.to_thread(self._publish_verdicts))

    def _publish_verdicts(self) -> None:
        from day0.receiver.verdicts import publish_gave_up  # the report model: loaded when needed

        for row in self.journal.verdicts_to_publish():
            try:
                where = publish_gave_up(row)
            except Exception as exc:  # asked again at the next reap
                log.warning("ERROR verdict of %s@%s on %s not published yet: %s: %s",
                            row["model"], row["revision"], row["target"], type(exc).__name__, exc)
                continue
            self.journal.verdict_published(row["id"], where)
            log.info("release %s@%s on %s: ERROR verdict published (%s)", row["model"],
                     row["revision"], row["target"], where)

    async def _submit(self, client, row: ReleaseRow, limit: asyncio.Semaphore) -> None:
        s = self.settings
        trusted = bool(s.trust_remote_code and under(row.source, s.trust_remote_code))
        # trust_remote_code comes from the receiver's config only, never from an event; the
        # target is always named (a run's parameters say what it validates without defaults)
        params = ValidateRequest(**{**s.flow_parameters, "source": row.source, "target": row.target,
                                    "model": row.model, "revision": row.revision,
                                    "trust_remote_code": trusted}).as_parameters()
        params["target"] = row.target
        try:
            async with limit:
                try:
                    run = await prefect.submit(
                        s.deployment, params, client=client, idempotency_key=row.idempotency_key,
                        tags=["day0", "release", f"origin:{row.origin}"])
                except Exception as exc:
                    delay = backoff(row.attempts, s.submit.backoff_initial_s, s.submit.backoff_max_s)
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("submitting %s failed (attempt %d, retry in %.1f s): %s",
                                row.idempotency_key, row.attempts + 1, delay, self.last_error)
                    await asyncio.to_thread(self.journal.mark_retry, row.id, delay, self.last_error)
                    return
                await asyncio.to_thread(self.journal.mark_submitted, row.id, str(run.id))
                self.submitted += 1
                log.info("submitted %s as flow run %s", row.idempotency_key, run.id)
                if s.submit.emit_events:
                    self._emit(row, run)
        finally:
            self._inflight.discard(row.id)
            self.wake()

    def _emit(self, row: ReleaseRow, run) -> None:
        """A Prefect event per release, so it shows in the UI's event feed next to its run."""
        try:
            related = [{"prefect.resource.id": f"prefect.flow-run.{run.id}",
                        "prefect.resource.role": "flow-run"}]
            if run.deployment_id:
                related.append({"prefect.resource.id": f"prefect.deployment.{run.deployment_id}",
                                "prefect.resource.role": "deployment"})
            prefect.emit_event(
                event="day0.release.accepted",
                resource={"prefect.resource.id": f"day0.release.{row.model}",
                          "prefect.resource.name": row.model,
                          "day0.revision": row.revision, "day0.target": row.target},
                related=related,
                payload={"source": row.source, "origin": row.origin,
                         "idempotency_key": row.idempotency_key, "flow_run_id": str(run.id)},
                # same id on a resubmission after a crash: the server stores the event once
                id=uuid.uuid5(EVENT_NAMESPACE, row.idempotency_key))
        except Exception as exc:  # events are informative; the flow run is what matters
            log.warning("could not emit Prefect event for %s: %s", row.idempotency_key, exc)
