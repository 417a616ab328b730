"""Drain the outbox, then show each drained run's verdict in Prefect.

A run whose report the results store did not take ends Failed "NOT PUBLISHED" (day0.rendering.
labels) with its files kept in the outbox (day0.store.outbox). :func:`drain_outbox` publishes
them once the store answers and then sets that flow run to its verdict's state (Completed "PASS",
Failed "FAIL" / "ERROR" / "BROKEN"; force=True: Prefect refuses a Failed -> Completed move
otherwise), its message the headline and where the report now is, its result (report.json) kept:
the results store ends up holding every verdict Prefect shows. It runs

* in ``day0 serve``, on a background thread, every ``outbox.drain_every_s`` (store.yaml), from
  its start (so ``day0 stack up``, which starts the stack's ``day0 serve``, drains it too);
* at the start of every ``validate`` flow run (tasks/housekeeping.py).

A run still running (the outbox was drained before its flow ended) is set once it has ended; a
run no longer "NOT PUBLISHED" (crashed, cancelled, changed by hand) or gone is left as it is.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable

from day0.rendering.labels import NOT_PUBLISHED
from day0.store import outbox, retry


def _result_of(state):
    """The state's persisted result (report.json), to carry over to the verdict's state:
    `day0 validate --deployment` reads the report through it (flows.results.read_report)."""
    from prefect.results import ResultRecord, ResultRecordMetadata

    data = getattr(state, "data", None)
    try:
        metadata = (data if isinstance(data, ResultRecordMetadata)
                    else ResultRecordMetadata.model_validate(data))
    except Exception:  # noqa: BLE001 - no result reference: the state goes without one
        return None
    record = ResultRecord(metadata=metadata, result=None)
    record.mark_persisted()  # already written: Prefect sends its reference, not the value
    return record


_health: dict[str, tuple[float, bool]] = {}  # API URL -> (when asked, answered)


def _answers(api: str) -> bool:
    """Whether the Prefect API answers /health within the probe timeout (cached as probes)."""
    import time

    import httpx

    probe = retry.settings().probe
    when, ok = _health.get(api, (0.0, False))
    if time.monotonic() - when > probe.cache_s:
        try:
            ok = httpx.get(api.rstrip("/") + "/health", timeout=probe.timeout_s).status_code == 200
        except httpx.HTTPError:
            ok = False
        _health[api] = (time.monotonic(), ok)
    return ok


def show_verdict(manifest: outbox.Manifest) -> bool:
    """Set the manifest's flow run from "NOT PUBLISHED" to its verdict's state. True when
    nothing is left to do (set, gone, or no longer "NOT PUBLISHED"); False when Prefect did not
    answer or the run has not ended yet (asked again at the next drain)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Completed, Failed

    from day0.errors import shorten
    from day0.orchestration.submit import api_url

    if not manifest.flow_run_id:
        return True
    if manifest.prefect_api_url and not _answers(manifest.prefect_api_url):
        return False  # asked briefly: Prefect's client would retry a dead API for a minute
    end = manifest.final_state
    try:
        with api_url(manifest.prefect_api_url), get_client(sync_client=True) as client:
            run = client.read_flow_run(manifest.flow_run_id)
            state = run.state
            if state is None or not state.is_final():
                return False  # the flow has not ended: its "NOT PUBLISHED" is still to come
            if state.name != NOT_PUBLISHED:
                return True
            message = shorten(f"{end.message}; published late to {manifest.published_uri}", 400,
                              tail=0.5)
            make = Completed if end.completed else Failed
            client.set_flow_run_state(run.id, make(name=end.name, message=message,
                                                   data=_result_of(state)), force=True)
            return True
    except ObjectNotFound:
        return True  # the run was deleted, or lived on a temporary server long gone
    except Exception:  # noqa: BLE001 - Prefect down or refusing: asked again next time
        return False


def drain_outbox(log: Callable[[str], None] | None = None, root=None) -> outbox.Drained:
    """Publish what the outbox holds where its store answers, and set each published run's
    Prefect state to its verdict's (:func:`show_verdict`). Bounded: one brief probe per store
    before anything is sent; never raises for a store or Prefect that does not answer. This is
    what `day0 serve` runs in the background."""
    return outbox.drain(root, on_published=show_verdict, log=log)


def start_draining(log: Callable[[str], None] | None = None,
                   every_s: float | None = None) -> threading.Event:
    """Drain the outbox every `every_s` (store.yaml's outbox.drain_every_s) on a daemon thread,
    for as long as this process runs (`day0 serve`); set the returned event to stop it."""
    say = log or (lambda line: print(f"day0 serve: {line}", file=sys.stderr, flush=True))
    period = every_s or retry.settings().outbox.drain_every_s
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                drain_outbox(say)
            except Exception as exc:  # noqa: BLE001 - the next pass tries again; serving goes on
                say(f"outbox: drain failed: {type(exc).__name__}: {exc}")
            stop.wait(period)

    threading.Thread(target=loop, name="day0-outbox", daemon=True).start()
    return stop


__all__ = ["drain_outbox", "start_draining", "show_verdict"]
