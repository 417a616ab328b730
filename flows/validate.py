"""The `validate` flow: the registered stages in waves (day0.stages.plan), gates, report.

Run it: ``day0 validate SOURCE --target cpu-bf16`` or, against a server,
``prefect deployment run 'validate/...' -p source=... -p target=cpu-bf16``. The parameters are
day0.request.ValidateRequest's; the flow names no stage: each wave's stages run in parallel,
a stage runs when what it requires (or runs after) succeeded on a sound checkpoint.

The run ends in a state named after the verdict (day0.rendering.labels): Completed "PASS", or Failed
"FAIL" / "ERROR" / "BROKEN", its message the report's headline, report.json its (JSON) result;
call it with ``return_state=True`` and read ``flows.results.report_of(state)``. A verdict the
results store did not take ends Failed "NOT PUBLISHED" until the outbox publishes it
(day0.store.outbox, day0.orchestration.outbox) and sets the verdict's state. It is named
``<model>@<revision> on <target>`` and tagged model:/revision:/target:/verdict:.
"""

from __future__ import annotations

import threading
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.exceptions import TerminationSignal
from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State
from prefect.utilities.annotations import quote

from day0.atomic import write_atomic
from day0.verdict import gates as gating
from day0.store import identity
from day0.rendering import labels
from day0.verdict import pipeline
from day0.execution import stagehost
from day0 import stages as registry
from day0.verdict import report as reporting
from day0.rendering import plots as plotting
from day0.rendering import publish as publishing
from day0.execution.contract import StageInputs
from day0.execution.stage import StageOutcome, interrupt_running
from day0.execution.targets import REFERENCE, resolve_target
from flows.results import result_storage
from tasks.artifacts import label_run, publish_artifacts
from tasks.engine import engine_session
from tasks.housekeeping import start_of_run, watch_worker
from tasks.stages import publish_report_task, run_stage_task


def _run_name() -> str:
    """'<model> on <target>' until the flow has resolved its target and the revision, and
    renames itself (the target is resolved once, in the flow)."""
    params = flow_run.parameters
    target = Path(params.get("target_file") or "").stem or params.get("target") or "?"
    source = str(params.get("source", "?"))
    return f"{params.get('model') or Path(source.rstrip('/')).name} on {target}"


def _outcome(name: str, future) -> StageOutcome:
    """A stage's outcome; a stage task that could not finish ends Failed with it as data. A
    task that itself broke (a day0 bug around the stage) is that stage's ERROR, named as such:
    the other stages and the report stand."""
    outcome = future.result(raise_on_failure=False)
    if isinstance(outcome, Exception):
        why = (f"day0 internal error around the stage: {type(outcome).__name__}: {outcome} "
               "(a day0 bug: report it)")
        return StageOutcome(stage=name, ok=False, failure="error", error=why[:2000],
                            exit_code=4, log_tail=why.splitlines()[-15:])
    if isinstance(outcome, BaseException):  # a signal, an interpreter exit: not a finding
        raise outcome
    return outcome


def _run_waves(waves: list[list[str]], inputs: StageInputs, configs: dict, use_cache: bool,
               weights: str, engine_error: str | None, logger, outcomes: dict,
               notes: list[str]):
    """Each wave's stages in parallel, a wave after the previous one; a stage whose needs failed
    is skipped with the reason. Fills outcomes as stages finish (kept should a day0 bug stop the
    run) and notes (a facts hook that raised). (skipped, facts, the SIGTERM that interrupted
    it)."""
    skipped, facts = {}, {}
    interrupted: TerminationSignal | None = None
    for wave in waves:
        if interrupted:
            skipped.update({name: "not run: the run was interrupted (SIGTERM)" for name in wave})
            continue
        futures = {}
        try:
            for name in wave:
                if reason := pipeline.blocked(name, outcomes, skipped):
                    skipped[name] = reason
                    continue
                if engine_error and registry.get(name).uses_endpoint:
                    outcomes[name] = pipeline.without_engine(name, engine_error)
                    continue
                stage_inputs, required = pipeline.stage_inputs(name, inputs, outcomes)
                futures[name] = run_stage_task.submit(
                    name, registry.get(name).locator, configs.get(name, {}), stage_inputs,
                    dict(facts), use_cache, weights, required)
            for name, future in futures.items():
                outcomes[name] = _outcome(name, future)
                facts.update(pipeline.facts_of(name, outcomes[name], notes))
        except TerminationSignal as exc:
            # SIGTERM (a worker cancelling, `kill`): the running stages get it too (a soak
            # stops its load and reports what it measured), the report is still written,
            # then the run ends as Prefect ends a terminated one; a second SIGTERM: at once
            interrupted = exc
            logger.warning("SIGTERM: stopping the running stages; the report keeps what "
                           "they measured")
            signalled = interrupt_running(exc.signal)
            for name, future in futures.items():
                if name not in outcomes:
                    # a stage still starting (its process not forked yet) missed the signal:
                    # it gets it once its process runs, not after its whole work
                    done = threading.Event()
                    future.add_done_callback(lambda _, done=done: done.set())
                    while not done.wait(0.2):
                        signalled = interrupt_running(exc.signal, signalled)
                    outcome = _outcome(name, future)
                    if not outcome.ok and outcome.failure != "target":  # stopped, not failed
                        outcome = outcome.model_copy(update={
                            "failure": "interrupted",
                            "error": f"interrupted: the run got signal {int(exc.signal)} before "
                                     "this stage finished"})
                    outcomes[name] = outcome
            for name in wave:
                if name not in outcomes:
                    skipped.setdefault(name, "not run: the run was interrupted (SIGTERM)")
    return skipped, facts, interrupted


# persisted so `day0 validate --deployment` can read the report of a served run: as JSON under
# day0's cache dir, never pickled (flows.results; the storage is resolved at import)
@flow(name="validate", flow_run_name=_run_name, persist_result=True,
      result_serializer="json", result_storage=result_storage())
def validate(source: str, target: str | None = "cpu-bf16", target_file: str | None = None,
             gates: str | None = None, out: str | None = None,
             stage_configs: dict[str, dict] | None = None, stages: list[str] | None = None,
             use_cache: bool = True, trust_remote_code: bool = False, model: str | None = None,
             revision: str | None = None, bring_up: bool = False,
             options: dict[str, str | bool] | None = None) -> State:
    """Validate the checkpoint at `source` on `target`; ends in the verdict's state with
    report.json (a dict) as its result.

    model and revision name the release (day0.store.identity: default the source's name and a digest
    of its weights); every run is kept under <results>/<model>/<revision>/<target>/runs/<run>/
    with latest.json naming the newest. options: the stages' own options by name (`day0
    stages`), e.g. {"promote_baseline": true} stores this run's performance figures as the
    baseline later runs are compared with (never done otherwise)."""
    logger = get_run_logger()
    start_of_run(logger)  # own this run by pid; crash runs and sweep folders of dead processes
    watch_worker(logger)  # a served run stops (Crashed, run again) when its worker dies
    target_profile = resolve_target(target, target_file)
    if target_profile.runner == "process":  # the host's imports overlap the checks below
        stagehost.prewarm()
    plotting.warm_up()  # while the stages run: the report's plots are drawn after the last
    gate_file = gating.load_gates(gates)  # config errors stop the run before any stage
    configs = registry.apply_options(stage_configs or {}, options)
    pipeline.check_configs(configs)
    waves = registry.plan(stages, target_profile.kind)
    partial = pipeline.partial(waves, target_profile.kind)  # judged on what ran, marked so
    pipeline.check_gates(gate_file, configs, waves)  # e.g. a paired gate its items cannot power
    pipeline.check_budgets(waves)  # a stage without budget factors: exit 2 before any stage
    weights = identity.weights_key(source)  # once: every stage's cache key shares it
    # an unreadable source is the stages' finding (exit 2 from the first), not a crashed flow
    release = identity.resolve(source, model=model, revision=revision, weights=weights,
                               strict=False)
    inputs = StageInputs(source=source, target=target_profile, reference=REFERENCE,
                         trust_remote_code=trust_remote_code, revision=release.revision,
                         bring_up=bring_up)
    where = (release.model, release.revision, target_profile.name)
    label_run(flow_run.id, logger, name=labels.run_name(*where),
              tags=labels.run_tags(*where, bring_up=bring_up, partial=bool(partial)))

    outcomes: dict[str, StageOutcome] = {}  # as stages finish: kept if a day0 bug strikes
    notes: list[str] = []
    facts: dict = {}
    try:
        with engine_session(target_profile, source, pipeline.needs_endpoint(waves),
                            logger) as engine:
            inputs = inputs.model_copy(update={"endpoint": engine.endpoint})
            skipped, facts, interrupted = _run_waves(waves, inputs, configs, use_cache, weights,
                                                     engine.error, logger, outcomes, notes)
        concluded = pipeline.conclude(gate_file, target_profile, outcomes, skipped, facts,
                                      planned=partial)
        report = reporting.build(
            source=source, target=target_profile, reference=REFERENCE, outcomes=outcomes,
            gate_results=concluded.gate_results, verdict=concluded.verdict, facts=facts,
            checkpoint_problems=concluded.checkpoint_problems, engine=engine.endpoint,
            identity=_identity(release), notes=notes, bring_up=bring_up, partial=partial)
    except Exception as exc:  # a day0 bug, no verdict: out keeps what finished (then exit 4)
        _keep_what_finished(exc, out, source, target_profile, outcomes, release, facts, logger)
        raise
    report_json = _publish(report, out, outcomes, logger)
    label_run(flow_run.id, logger, tags=labels.run_tags(*where, report.verdict, bring_up,
                                                        bool(partial)))
    end = labels.final_state(reporting.Report.model_validate(report_json))
    logger.info("verdict %s for %s on %s", end.message, source, target_profile.label)
    if interrupted:
        raise interrupted
    return (Completed if end.completed else Failed)(name=end.name, message=end.message,
                                                    data=report_json)


def _identity(release) -> dict:
    run_id = identity.new_run_id(str(flow_run.id) if flow_run.id else None)
    return {"model": release.model, "revision": release.revision,
            "weights_digest": release.weights_digest, "run_id": run_id}


def _publish(report: reporting.Report, out: str | None, outcomes: dict, logger) -> dict:
    """report.json (first), report.md, plots and files in out and the results store, then the
    Prefect artifacts; report.json as a dict, its notes those of any hook that raised."""
    plots = publishing.plots(report, logger)
    report_json = report.model_dump(mode="json")
    try:
        # quoted: Prefect would walk the report, outcomes and plots twice looking for futures
        # (0.8 s of a validation's flow process); they hold none
        published = publish_report_task(quote(report_json), out, quote(outcomes), quote(plots))
    except Exception as exc:  # a day0 bug while publishing: the verdict stands, named
        line = f"the report could not be published: {type(exc).__name__}: {exc} (a day0 bug)"
        logger.error("%s", line)
        published = {"results_uri": None, "notes": [*report.notes, line],
                     "unpublished": line if identity.results_base(report.source) else None}
        if out:  # at least the evidence
            report.notes = published["notes"]
            Path(out).mkdir(parents=True, exist_ok=True)
            write_atomic(Path(out) / "report.json", report.model_dump_json(indent=2))
    report_json.update(results_uri=published["results_uri"], notes=published["notes"],
                       unpublished=published["unpublished"])  # then "NOT PUBLISHED" (labels)
    publish_artifacts(reporting.Report.model_validate(report_json), plots, flow_run.id, logger)
    return report_json


def _keep_what_finished(exc: BaseException, out: str | None, source: str, target, outcomes: dict,
                        release, facts: dict, logger) -> None:
    """report.json in out with every stage that finished, when a day0 bug left no verdict."""
    logger.error("day0 internal error, no verdict: %s: %s; report.json keeps the %d stage(s) "
                 "that finished", type(exc).__name__, exc, len(outcomes))
    if not out:
        return
    try:
        report = reporting.unconcluded(source=source, target=target, reference=REFERENCE,
                                       outcomes=outcomes, error=exc, facts=facts,
                                       identity=_identity(release))
        Path(out).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(out) / "report.json", report.model_dump_json(indent=2))
    except Exception as again:  # noqa: BLE001 - the first error is the one to raise
        logger.error("could not write report.json either: %s: %s", type(again).__name__, again)
