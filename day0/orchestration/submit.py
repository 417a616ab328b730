"""Prefect's client side, for the engine: flow runs of deployments, the API URL, events.

Only Prefect's client is imported here (never flows/ or tasks/), so the release receiver can
submit runs without loading the flow and its stages. Flow runs come back as Prefect's
``FlowRun`` objects; callers read ``.id``, ``.name``, ``.deployment_id`` and ``.state``
(``is_final()``, ``is_completed()``, ``.name``, ``.message``) and nothing else.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Iterator

from day0.errors import ConfigError


class DeploymentNotFound(ConfigError):
    """The Prefect server knows no deployment of that name."""


def preload() -> None:
    """Import the client modules now, not under the first request's load (seconds of GIL)."""
    for module in ("prefect.deployments", "prefect.events", "prefect.client.orchestration"):
        importlib.import_module(module)


@contextlib.contextmanager
def api_url(url: str | None, *, csrf: bool | None = None) -> Iterator[None]:
    """Talk to the Prefect API at url within the block (None: whatever is configured). csrf
    (not None) says whether that server enforces CSRF protection: when it does not, clients
    skip the token request it would answer with 422 (PREFECT_CLIENT_CSRF_SUPPORT_ENABLED)."""
    from prefect.settings import (PREFECT_API_URL, PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
                                  temporary_settings)

    updates = {PREFECT_API_URL: url} if url else {}
    if csrf is not None:
        updates[PREFECT_CLIENT_CSRF_SUPPORT_ENABLED] = csrf
    with temporary_settings(updates=updates):
        yield


def client():
    """An async Prefect client: ``async with client() as c: ...``."""
    from prefect.client.orchestration import get_client

    return get_client()


def run(name: str, parameters: dict[str, Any], *, timeout: float | None,
        poll_interval: float | None = None, tags: list[str] | None = None,
        as_subflow: bool = True, idempotency_key: str | None = None):
    """Start a flow run of deployment `name` and wait up to timeout seconds (None: until it
    ends); returns the FlowRun, final or not. Raises DeploymentNotFound. The same
    idempotency_key returns the same run (a retried request creates no second one)."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    extra = {"poll_interval": poll_interval} if poll_interval is not None else {}
    if idempotency_key:
        extra["idempotency_key"] = idempotency_key
    try:
        return run_deployment(name=name, parameters=parameters, timeout=timeout, tags=tags,
                              as_subflow=as_subflow, _sync=True, **extra)
    except ObjectNotFound:
        raise DeploymentNotFound(f"deployment {name} does not exist on the Prefect server",
                                 field="deployment", fix="register or serve it first") from None


async def submit(name: str, parameters: dict[str, Any], *, client, idempotency_key: str,
                 tags: list[str]):
    """Create a flow run of deployment `name` without waiting (the same key returns the same
    run: a resubmission after a crash creates no second one)."""
    from prefect.deployments import arun_deployment

    return await arun_deployment(name=name, client=client, parameters=parameters, timeout=0,
                                 idempotency_key=idempotency_key, as_subflow=False, tags=tags)


async def ended(client, flow_run_ids: list) -> dict:
    """flow run id -> (end time in epoch s, why it crashed or None) of those of `flow_run_ids`
    (UUIDs, one page: at most 200) that reached a final state, or no longer exist (their end:
    now). A Crashed run ended without a verdict: its process died (the worker's own report, or
    the zombie automation of day0.orchestration.recovery when heartbeats stopped)."""
    import time

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    found = await client.read_flow_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(flow_run_ids))),
        limit=len(flow_run_ids))
    out = {run_id: (time.time(), None) for run_id in flow_run_ids}  # deleted: never run again
    for run in found:
        state = run.state
        if state is None or not state.is_final():
            out.pop(run.id, None)
            continue
        end = run.end_time or state.timestamp
        why = (state.message or "crashed").splitlines()[0][:500] if state.is_crashed() else None
        out[run.id] = (end.timestamp() if end else time.time(), why)
    return out


def cancel(flow_run_id) -> str:
    """Cancel a flow run that outlived its deadline; returns a note for the reason."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Cancelling

    try:
        with get_client(sync_client=True) as c:
            current = c.read_flow_run(flow_run_id).state
            if current is not None and current.is_final():
                return f"it ended {current.name} meanwhile"
            # a run no worker picked up has no infrastructure to stop: cancel it outright;
            # otherwise Cancelling makes the worker stop its container/job
            state = Cancelled() if current is None or current.is_scheduled() else Cancelling()
            c.set_flow_run_state(flow_run_id, state, force=True)
            return "cancelled" if state.is_cancelled() else "cancellation requested"
    except Exception as exc:  # keep the caller's timeout outcome even when the API is gone
        return f"could not cancel it: {type(exc).__name__}: {exc}".splitlines()[0][:200]


def emit_event(**kwargs) -> None:
    """prefect.events.emit_event (shown in the UI's event feed)."""
    from prefect.events import emit_event as emit

    emit(**kwargs)


__all__ = ["DeploymentNotFound", "preload", "api_url", "client", "run", "submit", "ended",
           "cancel", "emit_event"]
