"""The `day0-stage` flow: one stage of a validation, run inside a work pool's job.

Deployed as ``day0-stage/docker`` and ``day0-stage/kubernetes`` (deploy/prefect.yaml) and
submitted by ``day0.execution.runners.deployment`` for targets with ``runner: deployment``. It runs the
stage with the process runner inside the job (the target's limits or the stage budget; its
``runner`` is ignored here), writes the StageOutcome JSON to ``result_uri`` and returns it.
A stage that fails is a failed outcome in a Completed run (the parent's gates read the reason);
the run itself is Failed/Crashed only when this flow breaks (bad spec, unwritable result_uri,
a killed container).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import Completed

from day0.execution.runners.deployment import write_outcome
from day0.execution.stage import StageSpec, run_stage
from tasks.progress import StageProgress


def _run_name() -> str:
    spec = flow_run.parameters.get("spec") or {}
    target = (spec.get("inputs") or {}).get("target") or {}
    return f"stage {spec.get('stage', '?')} on {target.get('name', '?')}"


def where_am_i() -> str:
    """'container <host>' inside Docker/Kubernetes, else 'process <host>' (shown in the logs)."""
    kind = ("pod" if os.environ.get("KUBERNETES_SERVICE_HOST") else
            "container" if Path("/.dockerenv").exists() else "process")
    return f"{kind} {socket.gethostname()} (uid {os.getuid()})"


@flow(name="day0-stage", flow_run_name=_run_name, persist_result=False, log_prints=False)
def day0_stage(spec: dict, result_uri: str | None = None):
    """Run one stage spec here and return its StageOutcome as a dict."""
    logger = get_run_logger()
    stage_spec = StageSpec.model_validate(spec)  # a bad spec is this flow's failure: Failed
    target = stage_spec.inputs.target
    logger.info("day0-stage %s for %s in %s", stage_spec.stage, target.label, where_am_i())
    # the target's limits, else the budget derived from the spec's upstream analysis
    tracker = StageProgress(stage_spec.stage, logger)  # its progress artifact on this run
    outcome = run_stage(stage_spec, log=tracker.line)
    tracker.finish(outcome.ok, outcome.failure or "")
    if result_uri:
        write_outcome(result_uri, outcome)  # unwritable: the run fails, the parent says why
    data = outcome.model_dump(mode="json")
    if outcome.ok:
        logger.info("stage %s finished in %.1f s", stage_spec.stage, outcome.seconds)
        return Completed(message=f"stage {stage_spec.stage} ok", data=data)
    logger.error("stage %s failed (%s): %s", stage_spec.stage, outcome.failure, outcome.error)
    return Completed(message=f"stage {stage_spec.stage} failed ({outcome.failure}): "
                             f"{outcome.error}"[:500], data=data)
