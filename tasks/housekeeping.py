"""Housekeeping at the start of every `validate` flow run.

A `day0 validate` killed by SIGKILL runs no cleanup: its stage processes and scratch folders are
handled by day0.execution.lifecycle, but its Prefect flow run would stay RUNNING forever. So each run

* tags itself with the host and the owner token (pid + kernel start time) of its process:
  ``day0-host:<hostname>``, ``day0-owner:<pid>-<start>``;
* sets Crashed every RUNNING `validate` run tagged with this host whose owner is dead;
* publishes what a results-store outage left in the outbox (day0.orchestration.outbox: a
  brief probe first, nothing sent to a store that does not answer);
* removes scratch folders of dead owners (day0.execution.lifecycle.sweep_scratch), and stage containers
  a dead owner started on this host (day0.execution.runners.docker.remove_orphaned_containers) when a
  Docker engine is configured here.

None of this may fail a validation: errors are logged as warnings.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from day0.execution import lifecycle

HOST_TAG = "day0-host:"
OWNER_TAG = "day0-owner:"


def owner_tags() -> list[str]:
    return [HOST_TAG + socket.gethostname(), OWNER_TAG + lifecycle.owner_token()]


def claim_run(client, flow_run) -> None:
    """Record this process as the owner of flow_run (tags, kept with the run's own)."""
    mine = owner_tags()
    kept = [t for t in flow_run.tags if not t.startswith((HOST_TAG, OWNER_TAG))]
    client.update_flow_run(flow_run.id, tags=kept + mine)


def crash_orphaned_runs(client, flow_name: str = "validate") -> list[str]:
    """Set Crashed the RUNNING runs of flow_name owned by a dead process on this host; returns
    their names. Runs of other hosts are never touched: their pids mean nothing here."""
    from prefect.client.schemas.filters import (FlowFilter, FlowFilterName, FlowRunFilter,
                                                FlowRunFilterState, FlowRunFilterStateType,
                                                FlowRunFilterTags)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    runs = client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
        flow_run_filter=FlowRunFilter(
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])),
            tags=FlowRunFilterTags(all_=[HOST_TAG + socket.gethostname()])))
    crashed = []
    for run in runs:
        owner = next((t[len(OWNER_TAG):] for t in run.tags if t.startswith(OWNER_TAG)), None)
        if owner is None or lifecycle.alive(owner):
            continue
        pid = owner.split("-")[0]
        client.set_flow_run_state(run.id, Crashed(message=(
            f"day0: the process that ran this flow (pid {pid} on {socket.gethostname()}) died "
            "without finishing it (killed?); found by a later validate run")), force=True)
        crashed.append(run.name)
    return crashed


def start_of_run(logger) -> None:
    """Claim the current flow run, crash orphaned runs, sweep dead owners' scratch folders,
    drain the outbox."""
    try:
        roots = [None, os.environ.get("DAY0_DOCKER_WORKDIR")]
        for folder in [f for root in dict.fromkeys(roots) if root or root is None
                       for f in lifecycle.sweep_scratch(root)]:
            logger.info("removed scratch folder %s of a dead day0 process", folder)
    except Exception as exc:  # housekeeping never fails a validation
        logger.warning("could not sweep scratch folders: %s", exc)
    if os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists():
        try:
            from day0.execution.runners.docker import remove_orphaned_containers

            for name in remove_orphaned_containers():
                logger.info("removed stage container %s of a dead day0 process", name)
        except Exception as exc:
            logger.warning("could not check for orphaned stage containers: %s", exc)
    try:
        from prefect.client.orchestration import get_client
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        with get_client(sync_client=True) as client:
            if context is not None and context.flow_run is not None:
                claim_run(client, context.flow_run)
            for name in crash_orphaned_runs(client):
                logger.warning("flow run %s was left RUNNING by a dead process: set Crashed", name)
    except Exception as exc:
        logger.warning("could not check for orphaned flow runs: %s", exc)
    try:  # what a store outage left unpublished, now that the store may answer again
        from day0.orchestration.outbox import drain_outbox

        drain_outbox(logger.info)
    except Exception as exc:
        logger.warning("could not drain the outbox: %s", exc)


def watch_worker(logger) -> None:
    """A run started by a worker (`day0 serve`, a process worker) stops when that worker dies
    rather than run on unsupervised: its report keeps what finished, it ends Crashed and the
    receiver runs the release again (day0.orchestration.recovery)."""
    from prefect.runtime import deployment

    from day0.orchestration import recovery

    if not deployment.id:  # `day0 validate` in this process: the caller supervises
        return
    try:
        recovery.watch_worker(lambda parent: logger.error(
            "the worker (pid %d) that started this run died: stopping the run (it ends Crashed "
            "and its release runs again)", parent))
    except Exception as exc:  # noqa: BLE001 - housekeeping never fails a validation
        logger.warning("could not watch the worker: %s", exc)


__all__ = ["start_of_run", "watch_worker", "claim_run", "crash_orphaned_runs", "owner_tags"]
