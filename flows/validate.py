"""The `validate` flow: analysis -> (scan || alignment) -> gates -> report.

Run it: ``day0 validate SOURCE --target cpu-bf16`` or, against a server,
``prefect deployment run 'validate/...' -p source=... -p target=cpu-bf16``.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from day0 import cache
from day0 import gates as gating
from day0 import report as reporting
from day0.contract import StageInputs
from day0.targets import REFERENCE, resolve_target
from flows.results import result_storage
from tasks.housekeeping import start_of_run
from tasks.stages import publish_report_task, run_stage_task

STAGE_ORDER = ("analysis", "scan", "alignment")


def _run_name() -> str:
    """'validate cpu-bf16: SOURCE', or the target file's name when the target comes from one."""
    params = flow_run.parameters
    target = params.get("target") or params.get("target_file") or "cpu-bf16"
    return f"validate {target}: {params.get('source', '?')}"


# persisted so `day0 validate --deployment` can read the report of a served run: as JSON under
# day0's cache dir, never pickled (flows.results; the storage is resolved at import)
@flow(name="validate", flow_run_name=_run_name, persist_result=True,
      result_serializer="json", result_storage=result_storage())
def validate(source: str, target: str | None = "cpu-bf16", target_file: str | None = None,
             gates: str | None = None, out: str | None = None,
             stage_configs: dict[str, dict] | None = None, use_cache: bool = True,
             trust_remote_code: bool = False, revision: str | None = None) -> dict:
    """Validate the checkpoint at `source` on `target`; returns report.json as a dict.

    revision names the release in the results path (s3:// sources or DAY0_RESULTS_URI:
    <base>/<model>/<revision or weights digest>/<target>/, see day0.storage) and keys the
    reference perplexity stored for later runs of the same model and revision (day0.sanity)."""
    logger = get_run_logger()
    start_of_run(logger)  # own this run by pid; crash runs and sweep folders of dead processes
    target_profile = resolve_target(target, target_file)
    gate_file = gating.load_gates(gates)  # config errors stop the run before any stage
    configs = stage_configs or {}
    inputs = StageInputs(source=source, target=target_profile, reference=REFERENCE,
                         trust_remote_code=trust_remote_code, revision=revision)

    weights = cache.weights_key(source)  # once: every stage's cache key shares it
    outcomes = {"analysis": run_stage_task("analysis", configs.get("analysis", {}), inputs,
                                           use_cache, weights)}
    header_broken = (outcomes["analysis"].result or {}).get("checkpoint_problems")
    if outcomes["analysis"].ok and not header_broken:  # comparing broken weights tells nothing
        downstream = inputs.model_copy(update={"upstream": {"analysis": outcomes["analysis"].result}})
        futures = {name: run_stage_task.submit(name, configs.get(name, {}), downstream, use_cache,
                                               weights)
                   for name in ("scan", "alignment")}
        outcomes.update({name: future.result() for name, future in futures.items()})

    failed = {name: o.error or "failed" for name, o in outcomes.items() if not o.ok}
    missing = {name: f"stage {name} failed: {failed[name]}" for name in failed}
    missing.update({name: "not run: " + ("the checkpoint is broken" if header_broken else
                                         "analysis failed")
                    for name in STAGE_ORDER if name not in outcomes})
    metrics = {k: v for o in outcomes.values() for k, v in o.metrics.items()}
    analysis = outcomes["analysis"].result or {}
    results = gating.evaluate(gate_file, metrics, is_moe=bool(analysis.get("moe")),
                              missing_reasons=missing, claim=target_profile.claim)
    # a target that raised is a finding (its gates fail: FAIL); a stage that broke is ERROR
    broken = {name: error for name, error in failed.items() if outcomes[name].failure != "target"}
    # any stage may find the checkpoint itself broken: that is its own verdict, not the port's
    checkpoint_problems = list(dict.fromkeys(
        p for o in outcomes.values() if o.ok for p in (o.result or {}).get("checkpoint_problems", [])))
    verdict = gating.verdict(results, broken, checkpoint_problems)
    report = reporting.build(source=source, target=target_profile, reference=REFERENCE,
                             outcomes=outcomes, gate_results=results, verdict=verdict,
                             checkpoint_problems=checkpoint_problems)
    report_json = report.model_dump(mode="json")
    report_json["results_uri"] = publish_report_task(report_json, out, outcomes, revision)
    logger.info("verdict %s for %s on %s", verdict, source, target_profile.label)
    return report_json
