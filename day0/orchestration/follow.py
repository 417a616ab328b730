"""Follow a flow run from outside: its UI address, its state and its stages' progress.

``day0 validate --deployment`` starts the run, prints where to watch it at once (``run_url``)
and then, while it waits (``follow``), one line whenever the run's state or a stage's progress
artifact (tasks/progress.py) changes — polled every ``poll_s`` seconds, a line at most every
``poll_s`` and at least every ``quiet_s`` while the run lasts.
"""

from __future__ import annotations

import time
from typing import Callable

POLL_S = 2.0
QUIET_S = 30.0


def run_url(flow_run_id) -> str:
    """The run's page in the Prefect UI: PREFECT_UI_URL, else derived from PREFECT_API_URL."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    base = settings.ui_url
    if not base:
        api = str(settings.api.url or "")
        base = api[:-4] if api.endswith("/api") else api.replace("/api/", "/")
    return f"{base.rstrip('/')}/runs/flow-run/{flow_run_id}"


def start(name: str, parameters: dict, *, tags: list[str] | None = None,
          say: Callable[[str], None] | None = None):
    """Create a flow run of deployment `name` and return it at once (not waiting), through a
    Prefect outage of at most client_outage_s: one key for every try, so a request that
    reached the server before its answer was lost creates no second run."""
    import uuid

    from prefect.settings import get_current_settings

    from day0.orchestration import submit
    from day0.orchestration.outage import Outage

    key = f"day0-cli:{uuid.uuid4()}"
    outage = Outage(str(get_current_settings().api.url or "?"), f"starting a run of {name}",
                    say=say)
    return outage.call(lambda: submit.run(name, parameters, timeout=0, tags=tags,
                                          as_subflow=False, idempotency_key=key))


def stage_progress(client, flow_run_id) -> dict[str, tuple[float, str]]:
    """artifact key -> (percent, description) of the run's progress artifacts."""
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId,
                                                ArtifactFilterType)

    found = client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
        type=ArtifactFilterType(any_=["progress"])))
    out: dict[str, tuple[float, str]] = {}
    for artifact in sorted(found, key=lambda a: str(a.created)):
        try:
            percent = float(artifact.data)
        except (TypeError, ValueError):
            continue
        out[artifact.key or str(artifact.id)] = (percent, artifact.description or "")
    return out


def summary(state_name: str, stages: dict[str, tuple[float, str]]) -> str:
    parts = [description or f"{key}: {percent:.0f} %"  # in the order the stages started
             for key, (percent, description) in stages.items()]
    return " | ".join([state_name, *parts])


def follow(flow_run_id, say: Callable[[str], None], *, poll_s: float = POLL_S,
           quiet_s: float = QUIET_S, timeout_s: float | None = None,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
    """Wait until the run is final (or timeout_s passed) and return it, saying its progress;
    through a Prefect outage of at most client_outage_s (then PrefectDown, exit 3)."""
    from prefect.settings import get_current_settings

    from day0.orchestration.outage import Outage, waiting_client

    started = clock()
    last_text, last_said = None, started
    outage = Outage(str(get_current_settings().api.url or "?"),
                    f"following flow run {flow_run_id}", say=say, clock=clock, sleep=sleep)
    with waiting_client() as client:
        while True:
            try:
                run = client.read_flow_run(flow_run_id)
                state = run.state
                if state is not None and state.is_final():
                    return run
                text = summary(state.name if state else "no state",
                               stage_progress(client, flow_run_id))
                outage.ok()
            except Exception as exc:  # noqa: BLE001 - the API may restart: waited through
                outage.failed(exc)  # PrefectDown (exit 3) past recovery.yaml's client_outage_s
                continue
            now = clock()
            if text is not None and (text != last_text or now - last_said >= quiet_s):
                say(f"  [{now - started:4.0f} s] {text}")
                last_text, last_said = text, now
            if timeout_s is not None and now - started >= timeout_s:
                return client.read_flow_run(flow_run_id)
            sleep(poll_s)


__all__ = ["run_url", "start", "follow", "stage_progress", "summary", "POLL_S", "QUIET_S"]
