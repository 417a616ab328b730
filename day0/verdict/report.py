"""The validation report as data: report.json's model (:class:`Report`), built from stage
outcomes, gate results and the stages' `evidence` and `findings` hooks. How it is shown is
day0.rendering's (report.md, the terminal table, plots, publishing)."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from day0 import __version__
from day0.execution.budget import StageBudget
from day0.verdict.gates import GateResult
from day0 import stages
from day0.errors import Day0Error
from day0.execution.stage import StageOutcome
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
    created_at: str
    day0_version: str = __version__
    results_uri: str | None = Field(None, description=(
        "Where report.json, report.md and stages/<stage>.json were published (day0.store.identity)."))

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def build(*, source: str, target: Target, reference: Target, outcomes: dict[str, StageOutcome],
          gate_results: list[GateResult], verdict: str, facts: dict | None = None,
          checkpoint_problems: list[str] | None = None, identity: dict | None = None,
          engine: Endpoint | None = None) -> Report:
    metrics: dict[str, float | None] = {}
    for outcome in outcomes.values():
        metrics.update(outcome.metrics)
    evidence, findings = {}, []
    for name, outcome in outcomes.items():
        if outcome.ok and outcome.result is not None:
            stage = _stage(name)
            evidence[name] = stage.evidence(outcome.result) if stage else dict(outcome.result)
            findings += list(stage.findings(evidence[name]) if stage else [])
    return Report(
        verdict=verdict, source=source, target=target, reference=reference, engine=engine,
        gates=gate_results,
        identity=dict(identity or {}), model=dict(facts or {}),
        stages={name: StageSummary(ok=o.ok, cached=o.cached, seconds=round(o.seconds, 3),
                                   failure=o.failure, error=o.error, ran_in=o.ran_in,
                                   budget=o.budget, peak_rss_gib=o.peak_rss_gib)
                for name, o in outcomes.items()},
        metrics=metrics, evidence=evidence,
        errors=[f"stage {name}: {o.error}" for name, o in outcomes.items() if not o.ok],
        checkpoint_problems=list(checkpoint_problems or []), findings=findings,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )


def _stage(name: str):
    """The registered stage of that name; None for one no longer registered (its evidence is
    kept as it is, its hooks give nothing)."""
    try:
        return stages.get(name)
    except Day0Error:
        return None
