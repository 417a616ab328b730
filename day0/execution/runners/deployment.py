"""Run a stage as a flow run of the ``day0-stage`` deployment on a Prefect work pool.

``run_on_deployment(spec, target, log)`` submits ``flows/stage.py:day0_stage`` through
day0.orchestration.submit (Prefect's ``run_deployment``) to ``target.deployment`` (e.g.
``day0-stage/docker``, a Docker or Kubernetes work pool, possibly on another machine), waits
for the child flow run's final state and returns a :class:`StageOutcome`. Like every runner it
never raises for the stage: ``run_deployment`` itself does not raise when the child fails, so
the final state is checked here:

* Completed                    -> the outcome the child wrote to ``result_uri`` (ok or not);
* Failed / Crashed / Cancelled -> failed outcome, failure ``crash``, reason naming the
  deployment, the flow run id and the state message;
* still running at the deadline (``target.timeout_s`` + ``DAY0_STAGE_START_GRACE_S`` for
  scheduling and image start) -> the child run is cancelled, failure ``timeout``.

How the outcome travels back: the parent picks ``result_uri`` and the child writes the
StageOutcome JSON there (atomically). The only things both sides reliably share across
machines are the Prefect API and the object store, and the Prefect result store of a
container is local to it unless configured, so:

* ``$DAY0_STAGE_RESULTS_URI`` (``s3://bucket/prefix`` or a folder mounted at the same path on
  the parent and in every job), else
* ``s3://<source bucket>/day0-results/_stages`` for an ``s3://`` source;
* otherwise a ``config`` failure says what to set (nothing is submitted).

The child needs the same DAY0_S3_* settings (job variable ``env``). The spec's
``inputs.source`` (and file plugins, an alignment ``text_file``) must be visible to the job:
an ``s3://`` source works anywhere; a local path must be mounted at the same absolute path
(Docker pool: job variable ``volumes``; Kubernetes pool: ``data_volume``/``data_volume_mount``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Callable

from day0.execution import progress
from day0.errors import Day0Error
from day0.execution.stage import StageOutcome, StageSpec
from day0.execution.targets import Target

RESULTS_ENV = "DAY0_STAGE_RESULTS_URI"
GRACE_ENV = "DAY0_STAGE_START_GRACE_S"
DEFAULT_GRACE_S = 300.0  # queueing, worker poll, image start: not part of the stage's own timeout
POLL_S = 1.0
UNKNOWN_HERE_WAIT_S = 600.0  # a stage only the worker knows: how long its run is waited for


def stage_results_base(spec: StageSpec) -> str | None:
    """Where stage outcomes are exchanged with the child run, or None when nowhere is shared."""
    from day0.store.identity import RESULTS_FOLDER
    from day0.store.s3 import S3Uri, is_s3, parse_s3_uri

    base = os.environ.get(RESULTS_ENV)
    if base:
        return base.rstrip("/")
    if is_s3(spec.inputs.source):
        return str(S3Uri(parse_s3_uri(spec.inputs.source).bucket, f"{RESULTS_FOLDER}/_stages"))
    return None


def write_outcome(uri: str, outcome: StageOutcome) -> None:
    """Child side: the outcome JSON at uri (s3:// or a local path), never half-written."""
    from day0.atomic import write_atomic
    from day0.store.s3 import is_s3, put_object

    data = outcome.model_dump_json()
    if is_s3(uri):
        put_object(uri, data.encode())
        return
    write_atomic(uri, data)  # a shared results folder: no guessable temp name


def read_outcome(uri: str) -> StageOutcome | None:
    """Parent side: the outcome at uri, or None when the child wrote none."""
    from day0.store.s3 import head_object, is_s3, read_object

    if is_s3(uri):
        if head_object(uri) is None:
            return None
        return StageOutcome.model_validate_json(read_object(uri))
    path = Path(uri)
    return StageOutcome.model_validate_json(path.read_text()) if path.is_file() else None


def _discard(uri: str) -> None:
    from day0.store.s3 import is_s3, parse_s3_uri, s3_client

    try:
        if is_s3(uri):
            u = parse_s3_uri(uri)
            s3_client().delete_object(Bucket=u.bucket, Key=u.key)
        else:
            Path(uri).unlink(missing_ok=True)
            try:
                Path(uri).parent.rmdir()
            except OSError:
                pass
    except Exception:  # housekeeping only
        pass


def _failed(spec: StageSpec, kind: str, message: str, started: float,
            ran_in: str = "") -> StageOutcome:
    return StageOutcome(stage=spec.stage, ok=False, failure=kind, error=message,
                        seconds=time.monotonic() - started, ran_in=ran_in)


def run_on_deployment(spec: StageSpec, target: Target,
                      log: Callable[[str], None] | None = None) -> StageOutcome:
    """Run spec as a flow run of target.deployment; always returns an outcome."""
    log = log or (lambda line: None)
    started = time.monotonic()
    name = target.deployment or ""
    try:
        return _run(spec, target, name, log, started)
    except Exception as exc:  # the API, the object store, ...: a failed stage, never a raise
        return _failed(spec, "error", f"stage '{spec.stage}' on deployment {name}: "
                       f"{type(exc).__name__}: {exc}".splitlines()[0][:500], started)


def _run(spec: StageSpec, target: Target, name: str, log, started: float) -> StageOutcome:
    from day0.execution.budget import for_spec
    from day0.orchestration import submit

    base = stage_results_base(spec)
    if base is None:
        return _failed(spec, "config", (
            f"stage '{spec.stage}' on deployment {name}: a local source needs a results location "
            f"both sides can reach: set {RESULTS_ENV}=s3://BUCKET/PREFIX (or a folder mounted at "
            "the same path in the jobs), or validate an s3:// source"), started)
    result_uri = f"{base}/{uuid.uuid4().hex}/{spec.stage}.json"
    grace = float(os.environ.get(GRACE_ENV) or DEFAULT_GRACE_S)
    # run_on_target hands over the budget's figures; a direct caller gets the derived budget,
    # or, for a stage this machine does not know (the worker may), a bound on the wait only:
    # the worker's runner derives and enforces the stage's own budget
    try:
        timeout_s = target.timeout_s or for_spec(spec).timeout_s
    except Day0Error:
        timeout_s = UNKNOWN_HERE_WAIT_S
    deadline_s = timeout_s + grace
    parameters = {"spec": json.loads(spec.model_dump_json()), "result_uri": result_uri}
    # the stage's own log and progress are on its flow run; here a line every 10 s of waiting
    beat = progress.Heartbeat(spec.stage, lambda line: log(f"{line} (on deployment {name})"))
    try:
        with beat.ticking():
            flow_run = submit.run(name, parameters, timeout=deadline_s, poll_interval=POLL_S,
                                  tags=["day0", f"stage:{spec.stage}"])
    except submit.DeploymentNotFound:
        return _failed(spec, "config", (
            f"stage '{spec.stage}': deployment {name} does not exist on the Prefect server: "
            f"register it: prefect deploy --prefect-file deploy/prefect.yaml --name {name}"), started)
    where = f"deployment {name}, flow run {flow_run.id} ({flow_run.name})"
    ran_in = f"deployment:{name}:{flow_run.id}"
    state = flow_run.state
    status = "ended" if state is not None and state.is_final() else "still"
    log(f"stage {spec.stage}: {where} {status} {state.name if state else 'without a state'}")

    try:
        if state is None or not state.is_final():
            note = submit.cancel(flow_run.id)
            return _failed(spec, "timeout", (
                f"stage '{spec.stage}' did not finish within {deadline_s:g} s "
                f"(timeout_s {timeout_s:g} + {grace:g} s start grace) on {where}: {note}"),
                started, ran_in)
        if not state.is_completed():
            message = (state.message or "").strip().splitlines()
            detail = f": {message[0][:300]}" if message else ""
            return _failed(spec, "crash", f"stage '{spec.stage}' on {where} ended {state.name}"
                           f"{detail}", started, ran_in)
        outcome = read_outcome(result_uri)
        if outcome is None:
            return _failed(spec, "crash", f"stage '{spec.stage}' on {where} completed but wrote "
                           f"no outcome at {result_uri} (is it shared with the job?)", started,
                           ran_in)
        if not outcome.ok:  # the child's full log is on its flow run; the tail explains here
            for line in outcome.log_tail[-10:]:
                log(line)
        return outcome.model_copy(update={"seconds": time.monotonic() - started, "ran_in": ran_in})
    finally:
        _discard(result_uri)


__all__ = ["run_on_deployment", "stage_results_base", "write_outcome", "read_outcome",
           "RESULTS_ENV", "GRACE_ENV"]
