"""Release gates: gates.yaml turns stage metrics into PASS/FAIL with reasons.

Validated at load with every problem at once: a gate naming a metric no stage produces is a
config error ("did you mean"). At evaluation a missing metric fails its gate ("not evaluated",
with its stage and why: reports show one row per stage then), and so does a NaN or infinite
value: a comparison with NaN never passes.
"""

from __future__ import annotations

import math
import operator
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from day0.errors import ConfigError, Problem, did_you_mean
from day0.yamlio import problems_from_validation, read_mapping

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}


class PairedSpec(BaseModel):
    """A paired statistical test of reference vs target on the same items (day0.verdict.statistics)."""

    model_config = ConfigDict(extra="forbid")

    test: Literal["mcnemar", "bootstrap"] = Field(description=(
        "mcnemar: exact one-sided McNemar test on per-item correctness; bootstrap: paired "
        "bootstrap of the mean per-item difference (continuous metrics)."))
    allowed_drop: float = Field(gt=0, lt=1e6, description=(
        "The drop (reference score - target score, in the metric's unit: 0.05 = 5 points of "
        "accuracy) this gate must detect with probability `power`; it must be at least the "
        "minimum detectable effect at the items' count, else the gate is a config error."))
    alpha: float = Field(0.05, gt=0, lt=0.5, description=(
        "One-sided significance: the gate fails when p < alpha (H1: the target is worse)."))
    power: float = Field(0.8, ge=0.5, lt=1, description="Probability of detecting allowed_drop.")
    discordance: float = Field(0.1, gt=0, le=1, description=(
        "mcnemar: assumed fraction of items on which the two sides disagree, for the "
        "minimum detectable effect (the observed one is used when larger)."))
    margin: float = Field(0.0, ge=0, description=(
        "bootstrap only: a drop up to this is no regression (H0: drop <= margin); a "
        "continuous score moves a little under any change of arithmetic."))

    @model_validator(mode="after")
    def _margin(self) -> "PairedSpec":
        if self.margin and self.test != "bootstrap":
            raise ValueError("margin is for test: bootstrap")
        if self.margin >= self.allowed_drop:
            raise ValueError("margin must be below allowed_drop")
        return self


class Gate(BaseModel):
    """One release criterion over one metric: a bound (op, threshold) or a paired test."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Unique id, shown in reports (lowercase, dashes).")
    metric: str = Field(description=(
        "Metric name as produced by a stage, e.g. alignment.logits.kl_mean; or a pattern of "
        "its metrics file such as performance.{workload}.ttft_p99_ms: the bound must hold for "
        "every metric it matches (judged on the worst; none matching fails the gate)."))
    op: Literal["<=", "<", ">=", ">", "=="] | None = Field(None, description=(
        "observed OP threshold must hold (not with `paired`)."))
    threshold: float | None = Field(None, description=(
        "The bound the observed value is compared with (not with `paired`)."))
    paired: PairedSpec | None = Field(None, description=(
        "Instead of op/threshold: a paired test of the target against the reference on the "
        "same items; the metric must be one a stage reports per item (`paired:` in its "
        "metrics file). Passes when p >= alpha."))
    by_claim: dict[Literal["faithful", "int8", "fp8", "int4"], float] = Field(
        default_factory=dict, description=(
            "Thresholds for targets that claim a quantized deployment (target field `claim`), "
            "e.g. {int8: 8.0}; other claims use `threshold`."))
    severity: Literal["error", "warning"] = Field(
        "error", description="error: a failure fails the verdict; warning: reported only.")
    applies_to: Literal["all", "moe", "dense"] = Field(
        "all", description="Evaluate only for MoE or dense models; otherwise reported as not applicable.")
    description: str = Field("", description="Why this gate exists.")

    @model_validator(mode="after")
    def _bound_or_test(self) -> "Gate":
        if self.paired is None and (self.op is None or self.threshold is None):
            raise ValueError("a gate needs op and threshold, or paired")
        if self.paired is not None and (self.op is not None or self.threshold is not None
                                        or self.by_claim):
            raise ValueError("a paired gate has no op, threshold or by_claim")
        return self


class GatesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = Field(1, description="Schema version of gates.yaml.")
    gates: list[Gate] = Field(description="The release gates, evaluated in order.")


class GateResult(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    id: str
    metric: str
    op: str
    observed: float | None
    threshold: float
    passed: bool
    applicable: bool = True
    severity: str
    reason: str
    not_evaluated: str | None = Field(None, description=(
        "Why the metric is missing, 'stage <name>: <reason>' (its stage failed or did not run); "
        "None when it was observed. Such a gate fails; ERROR or BROKEN still win the verdict."))
    not_selected: str | None = Field(None, description=(
        "A partial run (`--stages`): the stage of this gate's metric was not selected, "
        "'stage <name>'. Such a gate is shown, neither failed nor counted (applicable is "
        "false): the verdict is over what ran. None when the stage was planned."))
    test: dict | None = Field(None, description=(
        "Paired gates: the test's statistics (day0.verdict.statistics.PairedTest: drop and its "
        "confidence interval, p-value, minimum detectable effect) and the flipped items."))


def metric_catalog() -> dict[str, dict]:
    """Every metric a registered stage can produce: name -> {description, unit, stage}.

    Each stage declares its metrics in its folder's metrics file (day0.execution.contract.Stage), named
    ``<stage>.*``; ``measured: true`` marks a figure of the machine at that moment."""
    from day0 import stages

    catalog: dict[str, dict] = {}
    for name in stages.names():
        path = stages.get(name).metrics_file
        if not path.is_file():
            raise ConfigError(f"stage '{name}' declares no metrics file", file=str(path),
                              fix="ship the YAML its metrics_name names ({metrics: {NAME: {...}}})")
        data = yaml.safe_load(path.read_text()) or {}
        for metric, info in (data.get("metrics") or {}).items():
            catalog[metric] = {**(info or {}), "stage": name}
    return catalog


def catalog_entry(metric: str, catalog: dict[str, dict]) -> dict | None:
    """The catalog's entry for metric: by name, or by a pattern such as
    ``evaluation.{category}.acc`` (a placeholder stands for one name segment)."""
    if metric in catalog:
        return catalog[metric]
    return next((info for name, info in catalog.items()
                 if "{" in name and matching(name, [metric])), None)


def default_gates_path() -> Path:
    """$DAY0_GATES, else ./gates.yaml, else the gates.yaml shipped at the project root."""
    import os

    if os.environ.get("DAY0_GATES"):
        return Path(os.environ["DAY0_GATES"])
    if Path("gates.yaml").is_file():
        return Path("gates.yaml")
    return Path(__file__).resolve().parents[2] / "gates.yaml"


def load_gates(path: str | Path | None = None) -> GatesFile:
    path = Path(path) if path else default_gates_path()
    data = read_mapping(path)
    try:
        parsed = GatesFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError.from_problems(problems_from_validation(exc, GatesFile, str(path))) from None
    problems: list[Problem] = []
    catalog = metric_catalog()
    seen: set[str] = set()
    for i, gate in enumerate(parsed.gates):
        if gate.id in seen:
            problems.append(Problem(f"duplicate gate id '{gate.id}'", file=str(path),
                                    field=f"gates.{i}.id", fix="give each gate a unique id"))
        seen.add(gate.id)
        entry = catalog_entry(gate.metric, catalog)
        if entry is None:
            hint = did_you_mean(gate.metric, catalog)
            problems.append(Problem(f"unknown metric '{gate.metric}': no stage produces it",
                                    file=str(path), field=f"gates.{i}.metric",
                                    fix=hint.strip() or "run `day0 metrics` to list the metrics"))
        elif gate.paired and not entry.get("paired"):
            problems.append(Problem(f"metric '{gate.metric}' is not reported per item",
                                    file=str(path), field=f"gates.{i}.paired",
                                    fix="give a paired test only to a metric whose catalog entry "
                                        "says `paired` (`day0 metrics`), or use op/threshold"))
        elif gate.paired and gate.paired.test == "mcnemar" and entry.get("paired") != "binary":
            problems.append(Problem(f"McNemar needs per-item correctness; '{gate.metric}' is "
                                    "continuous", file=str(path), field=f"gates.{i}.paired.test",
                                    fix="use test: bootstrap"))
        bounds = [] if gate.paired else [gate.threshold, *gate.by_claim.values()]
        if not all(math.isfinite(t) for t in bounds):
            problems.append(Problem("threshold must be a finite number", file=str(path),
                                    field=f"gates.{i}.threshold", fix="use a finite bound"))
    if not parsed.gates:
        problems.append(Problem("no gates: an empty gate list would pass anything", file=str(path),
                                field="gates", fix="declare at least one gate"))
    if problems:
        raise ConfigError.from_problems(problems)
    return parsed


def evaluate(gates: GatesFile, metrics: dict[str, float | None], *, is_moe: bool,
             missing_reasons: dict[str, str] | None = None, claim: str = "faithful",
             inapplicable: dict[str, str] | None = None,
             paired: dict[str, dict] | None = None,
             unselected: list[str] | None = None) -> list[GateResult]:
    """Judge every gate. missing_reasons maps a metric prefix (stage) to why it is absent
    (e.g. "failed: <error>", "not run: analysis failed");
    claim selects by_claim thresholds (the target's claim); inapplicable maps a metric prefix
    (a stage that does not run on this kind of target) or a whole metric (pattern) to why its
    gates do not apply;
    paired maps a metric to its per-item values on both sides (StageResult.paired_items);
    unselected names the stages a partial run did not select: their gates are "not selected"."""
    results = []
    for gate in gates.gates:
        # a paired gate's observed value is its p-value, and it passes when p >= alpha
        threshold, op = ((gate.paired.alpha, ">=") if gate.paired
                         else (gate.by_claim.get(claim, gate.threshold), gate.op))
        base = dict(id=gate.id, metric=gate.metric, op=op, threshold=threshold,
                    severity=gate.severity)
        why_not = next((r for prefix, r in (inapplicable or {}).items()
                        if gate.metric == prefix or gate.metric.startswith(prefix + ".")),
                       None)
        if why_not:
            results.append(GateResult(**base, observed=None, passed=True, applicable=False,
                                      reason=f"not applicable: {why_not}"))
            continue
        stage = gate.metric.split(".")[0]
        if stage in (unselected or ()):
            results.append(GateResult(**base, observed=None, passed=True, applicable=False,
                                      not_selected=f"stage {stage}",
                                      reason=f"not selected: stage {stage} did not run in this "
                                             "partial validation"))
            continue
        if gate.applies_to != "all" and (gate.applies_to == "moe") != is_moe:
            kind = "MoE" if is_moe else "dense"
            results.append(GateResult(**base, observed=metrics.get(gate.metric), passed=True,
                                      applicable=False,
                                      reason=f"not applicable: {kind} model, gate is for {gate.applies_to}"))
            continue
        test = _paired_p(gate, (paired or {}).get(gate.metric)) if gate.paired else None
        worst = None
        if gate.paired:
            observed = (test or {}).get("p_value")
        elif "{" in gate.metric:
            worst, observed = _worst(gate, metrics)
            base["metric"] = worst or gate.metric
        else:
            observed = metrics.get(gate.metric)
        if observed is None:
            stage, why = next(((prefix, r) for prefix, r in (missing_reasons or {}).items()
                               if gate.metric.startswith(prefix + ".")),
                              (gate.metric.split(".")[0], "no stage reported it"))
            note = f"stage {stage}: {why}"
            results.append(GateResult(**base, observed=None, passed=False, not_evaluated=note,
                                      reason=f"not evaluated ({note})"))
            continue
        observed = float(observed)
        if not math.isfinite(observed):
            results.append(GateResult(**base, observed=observed, passed=False,
                                      reason=f"observed {observed} is not finite"))
            continue
        if test:
            results.append(GateResult(**base, observed=observed, passed=test["passed"],
                                      reason=test["reason"], test=test))
            continue
        passed = OPS[gate.op](observed, threshold)
        relation = "holds" if passed else "violated"
        where = f"{worst}: " if worst else ""
        results.append(GateResult(**base, observed=observed, passed=passed,
                                  reason=f"{where}{observed:.6g} {gate.op} {threshold:g} {relation}"
                                  + (f" ({claim} claim)" if claim in gate.by_claim else "")
                                  + (f" (worst of {gate.metric})" if worst else "")))
    return results


def matching(pattern: str, names) -> list[str]:
    """Names a metric pattern (``performance.{workload}.ttft_p99_ms``) matches, in order."""
    import re

    regex = re.sub(r"\\\{[a-z_]+\\\}", "[A-Za-z0-9_-]+", re.escape(pattern))
    return [n for n in names if re.fullmatch(regex, n)]


def _worst(gate: Gate, metrics: dict[str, float | None]) -> tuple[str | None, float | None]:
    """The matching metric furthest on the failing side of the bound (a missing or NaN value
    is the worst); (None, None) when nothing matches."""
    found = matching(gate.metric, metrics)
    if not found:
        return None, None
    for name in found:
        value = metrics[name]
        if value is None or not math.isfinite(float(value)):
            return name, value
    if gate.op == "==":
        return max(((n, metrics[n]) for n in found),
                   key=lambda nv: abs(float(nv[1]) - gate.threshold))
    name = (max if gate.op in ("<=", "<") else min)(found, key=lambda n: float(metrics[n]))
    return name, metrics[name]


FLIPS_IN_GATE = 20


def _paired_p(gate: Gate, items: dict | None) -> dict | None:
    """The paired test of a gate on its metric's per-item values: the test's statistics, the
    items the reference got right and the target wrong, passed and reason; None without data.
    A gate whose allowed drop is below what the items can detect fails (its n is too small:
    a pass would prove nothing)."""
    from day0.verdict import statistics

    if not items or not items.get("reference"):
        return None
    spec = gate.paired
    ref, tgt = items["reference"], items["target"]
    if spec.test == "mcnemar":
        test = statistics.mcnemar(ref, tgt, allowed_drop=spec.allowed_drop, alpha=spec.alpha,
                                   power=spec.power, discordance=spec.discordance)
    else:
        test = statistics.paired_bootstrap(ref, tgt, allowed_drop=spec.allowed_drop,
                                            alpha=spec.alpha, power=spec.power,
                                            higher_is_better=items.get("higher_is_better", True),
                                            margin=spec.margin)
    ids = items.get("ids") or [str(i) for i in range(len(ref))]
    worse = [i for i, r, t in zip(ids, ref, tgt) if (r > t) == items.get("higher_is_better", True)
             and r != t]
    out = test.model_dump(mode="json") | {"flipped_worse": worse[:FLIPS_IN_GATE],
                                           "flipped_worse_count": len(worse)}
    if test.mde > spec.allowed_drop:
        out |= {"passed": False, "reason": (
            f"{test.n} items cannot detect a drop of {spec.allowed_drop:g} (MDE {test.mde:.3g} at "
            f"alpha {spec.alpha:g}, power {spec.power:g}): needs {test.items_needed} items; "
            f"{test.summary()}")}
    else:
        out |= {"passed": not test.regressed, "reason": test.summary()}
    return out


def verdict(results: list[GateResult], stage_errors: dict[str, str],
            checkpoint_problems: list[str] | None = None) -> str:
    """ERROR when a stage failed, else BROKEN when the checkpoint itself is broken (a stage
    reported checkpoint_problems: no comparison of target and reference means anything then),
    else FAIL when an error-severity gate failed, else PASS."""
    if stage_errors:
        return "ERROR"
    if checkpoint_problems:
        return "BROKEN"
    if any(not r.passed and r.severity == "error" for r in results):
        return "FAIL"
    return "PASS"
