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
                 on_found: Callable[[RunInfo], None] | None = None) -> RunInfo | None:
    """The first run of `deployment` for `source` created since `since`, once final; None
    when none appeared or it did not end within timeout_s (csrf: submit.api_url's)."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    seen: str | None = None
    with _api_url(api, csrf=csrf), get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = runs_of(client, deployment, source, since)
            if runs:
                run = runs[0]
                if seen != run.id and on_found is not None:
                    on_found(run)
                seen = run.id
                if run.final:
                    return run
            time.sleep(poll_s)
    return None


__all__ = ["RunInfo", "runs_of", "wait_for_run"]
