"""Reading flow runs of a deployment (for `day0 stack upload --wait`): find the run an upload
started and wait until it is final. Plain data out, so callers never touch Prefect objects."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from day0.orchestration.submit import api_url as _api_url


@dataclass(frozen=True)
class RunInfo:
    id: str
    name: str
    state_type: str  # COMPLETED, FAILED, CRASHED, ... (Prefect's StateType)
    state_name: str
    message: str | None
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.state_type in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def _info(run) -> RunInfo:
    state = run.state
    return RunInfo(id=str(run.id), name=run.name, parameters=dict(run.parameters or {}),
                   state_type=state.type.value if state else "PENDING",
                   state_name=state.name if state else "Pending",
                   message=state.message if state else None)


def runs_of(client, deployment: str, source: str, since: dt.datetime) -> list[RunInfo]:
    """Runs of `deployment` for `source` created at or after `since`, oldest first."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
    from prefect.client.schemas.sorting import FlowRunSort

    dep = client.read_deployment_by_name(deployment)
    found = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[dep.id])),
        sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=100)
    mine = [r for r in found if (r.parameters or {}).get("source") == source
            and r.created is not None and r.created >= since]
    return [_info(r) for r in sorted(mine, key=lambda r: r.created)]


def wait_for_run(deployment: str, source: str, since: dt.datetime, *, api: str,
                 timeout_s: float, poll_s: float = 2.0, csrf: bool | None = None,
                 on_found: Callable[[RunInfo], None] | None = None,
                 say: Callable[[str], None] | None = None,
                 rerun_wait_s: float = 60.0) -> RunInfo | None:
    """The run of `deployment` for `source` created since `since`, once final; None when none
    appeared or it did not end within timeout_s (csrf: submit.api_url's). A run that Crashed
    (its process died) is followed by the run the receiver starts again for its release, when
    one appears within rerun_wait_s. A Prefect outage is waited through (say gets a line when
    it starts and ends), at most recovery.yaml's client_outage_s in a row: then PrefectDown
    (exit 3)."""
    from day0.orchestration.outage import Outage, waiting_client

    say = say or (lambda line: None)
    deadline = time.monotonic() + timeout_s
    followed: str | None = None
    crashed_at: float | None = None
    outage = Outage(api, f"waiting for the run of {source}", say=say)
    with _api_url(api, csrf=csrf), waiting_client() as client:
        while time.monotonic() < deadline:
            try:
                runs = runs_of(client, deployment, source, since)  # oldest first
            except Exception as exc:  # noqa: BLE001 - an outage is waited through, a bug raised
                outage.failed(exc)  # PrefectDown (exit 3) once it lasts past the limit
                continue
            outage.ok()
            ids = [r.id for r in runs]
            at = ids.index(followed) if followed in ids else 0
            if runs:
                run = runs[at]
                if followed != run.id and on_found is not None:
                    on_found(run)
                followed = run.id
                if run.state_type == "CRASHED":
                    if at + 1 < len(runs):  # the receiver's new run of the release
                        say(f"flow run {run.name} crashed ({run.message or 'no message'}); "
                            f"following {runs[at + 1].name}, which runs its release again")
                        followed, crashed_at = runs[at + 1].id, None
                        if on_found is not None:
                            on_found(runs[at + 1])
                        continue
                    if crashed_at is None:
                        crashed_at = time.monotonic()
                    elif time.monotonic() - crashed_at > rerun_wait_s:
                        return run
                elif run.final:
                    return run
            time.sleep(poll_s)
    return None


__all__ = ["RunInfo", "runs_of", "wait_for_run"]
