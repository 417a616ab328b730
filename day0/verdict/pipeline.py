"""What the `validate` flow decides between stages, without Prefect: which stage may run, what
each later stage is given, and the verdict from all outcomes.

The flow (flows/validate.py) only wires: for each wave of :func:`day0.stages.plan` it asks
:func:`blocked` whether a stage may run, builds its inputs with :func:`stage_inputs`, runs the
others of the wave in parallel, and ends with :func:`conclude`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from day0.verdict import gates as gating
from day0 import stages
from day0.verdict import hooks
from day0.execution.contract import StageInputs
from day0.verdict.gates import GateResult, GatesFile
from day0.execution.stage import StageOutcome
from day0.execution.targets import Target


def check_configs(configs: dict, where: str | None = None) -> None:
    """Before any stage runs: every stage_configs key names a registered stage, and its settings
    validate against that stage's Config (unknown fields with did-you-mean). Every problem of
    every stage at once, as a ConfigError (exit 2)."""
    from pydantic import ValidationError

    from day0.errors import ConfigError, did_you_mean
    from day0.yamlio import problems_from_validation

    known = stages.names()
    for name in configs or {}:
        if name not in known:
            raise ConfigError(f"unknown stage '{name}'", file=where, field=name,
                              fix=did_you_mean(name, known).strip() or f"use one of {known}")
    problems = []
    for name, settings in (configs or {}).items():
        model = stages.get(name).config_model()
        try:
            model.model_validate(settings or {})
        except ValidationError as exc:
            problems += problems_from_validation(exc, model, where or "stage_configs",
                                                 prefix=f"{name}.")
    if problems:
        raise ConfigError.from_problems(problems)


def check_gates(gate_file: GatesFile, configs: dict, waves: list[list[str]]) -> None:
    """Before any stage runs: each planned stage's `check_gates` hook judges the gates on its
    metrics against its config (e.g. a paired gate whose allowed drop the task's items cannot
    detect). Every problem at once, as a ConfigError (exit 2)."""
    from day0.errors import ConfigError

    problems = []
    for name in (n for wave in waves for n in wave):
        problems += stages.get(name).check_gates(configs.get(name) or {}, gate_file.gates)
    if problems:
        raise ConfigError.from_problems(problems)


def check_budgets(waves: list[list[str]]) -> None:
    """Before any stage runs: every planned stage declares its resource budget factors (its
    folder's budget.yaml, or the factors file's entry). Every problem at once (exit 2)."""
    from day0.execution.budget import load_factors, stage_factors
    from day0.errors import ConfigError, Day0Error

    factors, problems = load_factors(), []
    for name in (n for wave in waves for n in wave):
        try:
            stage_factors(name, factors)
        except Day0Error as exc:
            problems += exc.problems
    if problems:
        raise ConfigError.from_problems(problems)


def blocked(name: str, outcomes: dict[str, StageOutcome], skipped: dict[str, str]) -> str | None:
    """Why stage `name` must not run, or None: a stage it requires or runs after failed, was not
    run, or found the checkpoint broken (comparing broken weights tells nothing)."""
    stage = stages.get(name)
    for dep in (*stage.requires, *stage.after):
        if dep in skipped:
            return f"not run: {dep} was not run"
        outcome = outcomes.get(dep)
        if outcome is None or not outcome.ok:
            return f"not run: {dep} failed"
        if (outcome.result or {}).get("checkpoint_problems"):
            return "not run: the checkpoint is broken"
    return None


def stage_inputs(name: str, base: StageInputs, outcomes: dict[str, StageOutcome]
                 ) -> tuple[StageInputs, dict[str, str]]:
    """The stage's inputs (with the results it requires as upstream) and the cache keys of
    those stages (its key includes them; never their results, which carry timings)."""
    stage = stages.get(name)
    required = stage.requires
    upstream = {dep: outcomes[dep].result or {} for dep in required}
    keys = {dep: outcomes[dep].cache_key or "" for dep in required}
    update: dict = {"upstream": upstream}
    if not stage.uses_endpoint:  # only engine stages talk to the engine (and go uncached)
        update["endpoint"] = None
    return base.model_copy(update=update), keys


def needs_endpoint(waves: list[list[str]]) -> bool:
    """Whether any planned stage talks to the engine (the flow launches it only then)."""
    return any(stages.get(name).uses_endpoint for wave in waves for name in wave)


def without_engine(name: str, why: str) -> StageOutcome:
    """The outcome of an engine stage whose engine never came up: ERROR with the reason."""
    return StageOutcome(stage=name, ok=False, failure="error", error=why, exit_code=3,
                        log_tail=why.splitlines()[-15:])


def facts_of(name: str, outcome: StageOutcome, notes: list[str] | None = None) -> dict:
    """The model facts a finished stage contributes (day0.stages `facts` hook); a hook that
    raises contributes none and is a note (day0.verdict.hooks)."""
    if not outcome.ok:
        return {}
    return hooks.call(name, "facts", outcome.result or {}, default={}, notes=notes)


def partial(waves: list[list[str]], target_kind: str) -> list[str]:
    """The planned stages when they are fewer than the full plan for this kind of target (a
    `--stages` selection): the run is partial, judged on what ran. [] for the full plan."""
    planned = [name for wave in waves for name in wave]
    full = {name for wave in stages.plan(None, target_kind) for name in wave}
    return planned if full - set(planned) else []


@dataclass
class Conclusion:
    gate_results: list[GateResult]
    verdict: str
    checkpoint_problems: list[str] = field(default_factory=list)


def conclude(gate_file: GatesFile, target: Target, outcomes: dict[str, StageOutcome],
             skipped: dict[str, str], facts: dict, planned: list[str] | None = None
             ) -> Conclusion:
    """Gates over every metric, then the verdict: a target that raised is a finding (its gates
    fail: FAIL); a stage that broke is ERROR; a checkpoint any stage found broken is BROKEN.
    planned: the stages of a partial run (:func:`partial`); the gates of the others are "not
    selected", neither failed nor counted. None or []: the full plan, every gate judged."""
    failed = {name: o.error or "failed" for name, o in outcomes.items() if not o.ok}
    # why a stage's metrics are missing; a report shows "not evaluated (stage X: why)" once
    missing = {name: f"failed: {error}" for name, error in failed.items()}
    missing.update(skipped)
    for name, outcome in outcomes.items():
        if outcome.ok:  # it ran: a gate on a metric it did not report is that gate's finding
            missing.setdefault(name, "ran without reporting this metric")
    for name in stages.names():
        missing.setdefault(name, "not run: not selected for this validation")
    unselected = [name for name in stages.names() if planned and name not in planned]
    metrics = {k: v for o in outcomes.values() for k, v in o.metrics.items()}
    # a stage that cannot run on this kind of target (in-process op replay on a served engine,
    # API smoke tests on a torch target) has no gates here: not applicable, not failed
    inapplicable = {name: f"stage {name} does not run on {target.kind} targets"
                    for name in stages.not_on(target.kind)}
    # a stage may find some of its gates without an object (no baseline to compare with yet)
    for o in outcomes.values():
        if o.ok:
            inapplicable.update((o.result or {}).get("inapplicable") or {})
    # per-item values of both sides (a stage's `paired_items`) for the paired gates
    paired = {k: v for o in outcomes.values() if o.ok
              for k, v in ((o.result or {}).get("paired_items") or {}).items()}
    results = gating.evaluate(gate_file, metrics, is_moe=bool(facts.get("moe")),
                              missing_reasons=missing, claim=target.claim,
                              inapplicable=inapplicable, paired=paired, unselected=unselected)
    broken = {name: error for name, error in failed.items() if outcomes[name].failure != "target"}
    checkpoint_problems = list(dict.fromkeys(
        p for o in outcomes.values() if o.ok for p in (o.result or {}).get("checkpoint_problems", [])))
    return Conclusion(results, gating.verdict(results, broken, checkpoint_problems),
                      checkpoint_problems)


__all__ = ["check_configs", "check_gates", "check_budgets", "blocked", "stage_inputs", "needs_endpoint", "without_engine", "facts_of", "partial", "conclude",
           "Conclusion"]
