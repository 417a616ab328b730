"""The validation report as data: report.json's model (:class:`Report`), built from stage
outcomes, gate results and the stages' `evidence` and `findings` hooks. How it is shown is
day0.rendering's (report.md, the terminal table, plots, publishing)."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from day0 import __version__
from day0.execution.budget import StageBudget
from day0.verdict.gates import GateResult
from day0.execution.stage import StageOutcome
from day0.verdict import hooks
from day0.engines.settings import Endpoint
from day0.execution.targets import Target


# 2 (bad input or config: day0.request.exit_status) and 4 (a day0 bug) are the CLI's own
EXIT_CODES = {"PASS": 0, "FAIL": 1, "ERROR": 3, "BROKEN": 5}


class StageSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool
    cached: bool
    seconds: float
    failure: str | None = None
    error: str | None = None
    ran_in: str = Field("", description="process, docker:IMAGE:CONTAINER or deployment:NAME:RUN_ID.")
    budget: StageBudget | None = Field(None, description=(
        "Memory and time the stage was allowed, and where each came from (day0.execution.budget)."))
    peak_rss_gib: float | None = Field(None, description=(
        "The stage process's own peak resident memory, GiB (None where unknown)."))


class Report(BaseModel):
    """report.json: the verdict and all evidence behind it."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    verdict: str = Field(description=(
        "PASS, FAIL (the target), BROKEN (the checkpoint itself) or ERROR (a stage could not finish)."))
    source: str
    identity: dict = Field(default_factory=dict, description=(
        "model, revision, weights_digest and run_id (day0.store.identity): where this run is kept."))
    model: dict = Field(default_factory=dict, description=(
        "What the model is, from the stages' facts: architecture, model_type, attention, moe, "
        "params, dimensions."))
    target: Target
    reference: Target
    engine: Endpoint | None = Field(None, description=(
        "Engine targets: the engine the stages talked to (attached or launched; ready_s: how "
        "long the launched plain configuration took to answer)."))
    gates: list[GateResult]
    stages: dict[str, StageSummary]
    metrics: dict[str, float | None]
    evidence: dict[str, dict] = Field(default_factory=dict, description=(
        "Each stage's evidence by stage name, as the stage chooses to show it (its `evidence` "
        "hook; stages/<stage>.json in the results keeps the whole outcome)."))
    errors: list[str] = Field(default_factory=list, description="Failed stages, one line each.")
    checkpoint_problems: list[str] = Field(default_factory=list, description=(
        "Findings that the checkpoint itself is broken (not the target), from every stage."))
    findings: list[str] = Field(default_factory=list, description=(
        "One-line findings of the stages (their `findings` hook), e.g. the first divergent "
        "layer; in the headline and printed by the CLI."))
    bring_up: bool = Field(False, description=(
        "The weights were declared untrained placeholders (`--bring-up`): the verdict judges "
        "the port against its control, never a release."))
    partial: list[str] = Field(default_factory=list, description=(
        "The stages a partial validation planned (`--stages`, with what they need); empty for "
        "the full plan. The verdict is over what ran: the other stages' gates are 'not "
        "selected'. The report, the CLI and the run's state say 'partial: stages ...'."))
    notes: list[str] = Field(default_factory=list, description=(
        "What could not be shown: a stage hook (its facts, evidence, findings, report.md "
        "section, tables, plots or files) that raised, one line each. Its part falls back to "
        "the plain default (metrics, the whole result); the verdict stands."))
    exit_status: int | None = Field(None, description=(
        "The exit code `day0 validate` ends with for this report: the verdict's (0, 1, 3, 5), "
        "2 when a stage refused its input or config (the CLI's own code for bad input), 4 when "
        "no verdict was reached. None in reports from before it was recorded."))
    created_at: str
    day0_version: str = __version__
    results_uri: str | None = Field(None, description=(
        "Where report.json, report.md and stages/<stage>.json were published (day0.store.identity)."))
    unpublished: str | None = Field(None, description=(
        "Why the results store did not take this run's files, and the outbox folder keeping "
        "them until it does (day0.store.outbox): the run ends Failed 'NOT PUBLISHED' and `day0 "
        "validate` exits non-zero (3 for a PASS: exit_code). None when published or when there is no results store; "
        "never in the published report.json."))

    @property
    def exit_code(self) -> int:
        code = self.exit_status if self.exit_status is not None else EXIT_CODES[self.verdict]
        return (code or 3) if self.unpublished else code  # an unpublished PASS is no success


def exit_status_of(verdict: str, outcomes: dict[str, StageOutcome]) -> int:
    """2 when a stage refused its input or config (bad input, whatever else ran), else the
    verdict's code: what the report and the CLI both say."""
    if any(o.failure in ("input", "config") for o in outcomes.values()):
        return 2
    return EXIT_CODES[verdict]


def build(*, source: str, target: Target, reference: Target, outcomes: dict[str, StageOutcome],
          gate_results: list[GateResult], verdict: str, facts: dict | None = None,
          checkpoint_problems: list[str] | None = None, identity: dict | None = None,
          engine: Endpoint | None = None, notes: list[str] | None = None,
          bring_up: bool = False, partial: list[str] | None = None) -> Report:
    """The report from the stages' outcomes; notes: what could not be shown so far (a hook
    that raised, day0.verdict.hooks), to which this adds its own."""
    notes = list(notes or [])
    metrics: dict[str, float | None] = {}
    for outcome in outcomes.values():
        metrics.update(outcome.metrics)
    evidence, findings = {}, []
    for name, outcome in outcomes.items():
        if outcome.ok and outcome.result is not None:
            evidence[name] = hooks.call(name, "evidence", outcome.result,
                                        default=dict(outcome.result), notes=notes)
            findings += list(hooks.call(name, "findings", evidence[name], default=[],
                                        notes=notes))
    return Report(
        verdict=verdict, source=source, target=target, reference=reference, engine=engine,
        gates=gate_results,
        identity=dict(identity or {}), model=dict(facts or {}),
        stages=summaries(outcomes), metrics=metrics, evidence=evidence,
        errors=[f"stage {name}: {o.error}" for name, o in outcomes.items() if not o.ok],
        checkpoint_problems=list(checkpoint_problems or []), findings=findings, notes=notes,
        bring_up=bring_up, partial=list(partial or []),
        exit_status=exit_status_of(verdict, outcomes), created_at=now(),
    )


def summaries(outcomes: dict[str, StageOutcome]) -> dict[str, StageSummary]:
    return {name: StageSummary(ok=o.ok, cached=o.cached, seconds=round(o.seconds, 3),
                               failure=o.failure, error=o.error, ran_in=o.ran_in,
                               budget=o.budget, peak_rss_gib=o.peak_rss_gib)
            for name, o in outcomes.items()}


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def unconcluded(*, source: str, target: Target, reference: Target,
                outcomes: dict[str, StageOutcome], error: BaseException,
                identity: dict | None = None, facts: dict | None = None) -> Report:
    """What finished when a day0 bug left no verdict (the CLI's exit 4): every stage's outcome
    and whole result as it came, no gate judged, the bug named. Its verdict field says ERROR so
    that nothing reading report.json can take it for a release verdict."""
    metrics = {k: v for o in outcomes.values() for k, v in o.metrics.items()}
    bug = (f"day0 internal error, no verdict reached: {type(error).__name__}: {error} (a day0 "
           "bug: report it; the stages' evidence below is kept as it finished)")
    return Report(
        verdict="ERROR", source=source, target=target, reference=reference, gates=[],
        identity=dict(identity or {}), model=dict(facts or {}), stages=summaries(outcomes),
        metrics=metrics, evidence={n: dict(o.result) for n, o in outcomes.items()
                                   if o.ok and o.result is not None},
        errors=[f"stage {n}: {o.error}" for n, o in outcomes.items() if not o.ok] + [bug],
        exit_status=4, created_at=now())


def gave_up(*, source: str, target: Target, reference: Target, identity: dict,
            error: str) -> Report:
    """What a release ends with when every run of it crashed (its process or machine died, the
    receiver's submit.crash_attempts in a row): no stage outcome, no gate judged, ERROR naming
    each attempt, so that the release still has a published verdict."""
    return Report(verdict="ERROR", source=source, target=target, reference=reference, gates=[],
                  identity=dict(identity), stages={}, metrics={}, errors=[error],
                  exit_status=EXIT_CODES["ERROR"], created_at=now())


_stage = hooks.stage_of  # the registered stage of that name, None for one no longer registered
