"""One Prefect task runs one isolated stage through the day0 stage runner, with caching."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed

from day0.execution import cache
from day0.rendering import labels
from day0 import stages as registry
from day0.execution.contract import StageInputs
from day0.execution.runners import run_on_target
from day0.execution.stage import StageOutcome, StageSpec
from tasks.progress import StageProgress


# never persisted: the flow persists its results, which would pickle task results too; stage
# outcomes are cached by day0.execution.cache as JSON
@task(name="stage", task_run_name="{stage}", cache_policy=NO_CACHE, persist_result=False)
def run_stage_task(stage: str, locator: str, config: dict, inputs: StageInputs,
                   facts: dict | None = None, use_cache: bool = True, weights: str | None = None,
                   required: dict[str, str] | None = None) -> StageOutcome:
    """Run `stage` with the target's runner (subprocess, container or stage deployment), bounded
    by the target's concurrency; a crash becomes a failed outcome, never a crashed flow: the
    task run ends Failed ("ERROR", or "FAIL" when the target raised) with the outcome as its
    data, so the flow still reaches a verdict. required: cache keys of the stages whose results
    it reads (inputs.upstream)."""
    logger = get_run_logger()
    spec = StageSpec(stage=stage, locator=locator, config=config, inputs=inputs,
                     facts=facts or {})
    key = cache.stage_key(spec, weights, required)
    # a served engine has no digest: what it answered today says nothing about tomorrow; a
    # stage that measures time measures this machine now
    cacheable = inputs.endpoint is None and not registry.get(stage).exclusive
    use_cache = use_cache and cacheable
    if use_cache and (hit := cache.load(key)) is not None:
        logger.info("stage %s: cache hit %s (weights, target, config and code unchanged)",
                    stage, key[:12])
        return hit.model_copy(update={"cache_key": key})
    # progress lines become the stage's progress artifact; the rest is logged as it comes
    tracker = StageProgress(stage, logger)
    outcome = run_on_target(spec, inputs.target, log=tracker.line)
    tracker.finish(outcome.ok, f"{outcome.seconds:.1f} s" if outcome.ok else outcome.failure or "")
    outcome = outcome.model_copy(update={"cache_key": key})
    if outcome.ok:
        if cacheable:
            cache.store(key, outcome)
        logger.info("stage %s finished in %.1f s (%s)", stage, outcome.seconds, outcome.ran_in)
        return outcome
    logger.error("stage %s failed (%s): %s", stage, outcome.failure, outcome.error)
    state = labels.stage_state(outcome.failure, outcome.error, stage)
    return Failed(name=state.name, message=state.message, data=outcome)


@task(name="publish-report", cache_policy=NO_CACHE, persist_result=False)
def publish_report_task(report_json: dict, out: str | None,
                        outcomes: dict[str, StageOutcome] | None = None,
                        plots: dict[str, bytes] | None = None) -> dict:
    """Report files (report.json, report.md, plots/<name>.png) in out, and on the object store
    (s3:// source or DAY0_RESULTS_URI). out's report.json is written first, before anything
    is rendered or sent. Returns {"results_uri": URI or None, "notes": the report's notes,
    with those of any hook that raised while rendering, "unpublished": why the store did not
    take it and where it is kept, or None}. The Prefect artifacts are the flow's
    (tasks/artifacts.py: attached to the flow run)."""
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_API_URL

    from day0.atomic import write_atomic
    from day0.verdict import report as reporting
    from day0.rendering import publish as publishing

    logger = get_run_logger()
    report = reporting.Report.model_validate(report_json)
    if out:  # the evidence first: whatever fails below, out holds report.json
        Path(out).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(out) / "report.json", report.model_dump_json(indent=2))
    # the outbox sets this run's state once it publishes what the store did not take now
    run = {"id": str(flow_run.id) if flow_run.id else None, "api_url": PREFECT_API_URL.value()}
    results_uri = publishing.publish_to_store(report, outcomes, logger, plots, flow_run=run)
    if out:
        json_path, md_path = publishing.write(
            report, out, plots, publishing.stage_files(outcomes, logger, report.notes))
        logger.info("report written to %s and %s", json_path, md_path)
    return {"results_uri": results_uri, "notes": list(report.notes),
            "unpublished": report.unpublished}
