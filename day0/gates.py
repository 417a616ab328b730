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
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from day0.errors import ConfigError, Problem, did_you_mean
from day0.yamlio import problems_from_validation, read_mapping

OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}


class Gate(BaseModel):
    """One release criterion over one metric."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Unique id, shown in reports (lowercase, dashes).")
    metric: str = Field(description="Metric name as produced by a stage, e.g. alignment.logits.kl_mean.")
    op: Literal["<=", "<", ">=", ">", "=="] = Field(description="observed OP threshold must hold.")
    threshold: float = Field(description="The bound the observed value is compared with.")
    by_claim: dict[Literal["faithful", "int8", "fp8", "int4"], float] = Field(
        default_factory=dict, description=(
            "Thresholds for targets that claim a quantized deployment (target field `claim`), "
            "e.g. {int8: 8.0}; other claims use `threshold`."))
    severity: Literal["error", "warning"] = Field(
        "error", description="error: a failure fails the verdict; warning: reported only.")
    applies_to: Literal["all", "moe", "dense"] = Field(
        "all", description="Evaluate only for MoE or dense models; otherwise reported as not applicable.")
    description: str = Field("", description="Why this gate exists.")


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


def metric_catalog() -> dict[str, dict]:
    """Every metric a registered stage can produce: name -> {description, unit, stage}.

    Each stage declares its metrics in its METRICS file (day0.stages), named ``<stage>.*``."""
    from day0 import stages

    catalog: dict[str, dict] = {}
    for name in stages.names():
        path = stages.get(name).metrics_file
        if not path.is_file():
            raise ConfigError(f"stage '{name}' declares no metrics file", file=str(path),
                              fix="ship the YAML its METRICS names ({metrics: {NAME: {...}}})")
        data = yaml.safe_load(path.read_text()) or {}
        for metric, info in (data.get("metrics") or {}).items():
            catalog[metric] = {**(info or {}), "stage": name}
    return catalog


def default_gates_path() -> Path:
    """$DAY0_GATES, else ./gates.yaml, else the gates.yaml shipped at the project root."""
    import os

    if os.environ.get("DAY0_GATES"):
        return Path(os.environ["DAY0_GATES"])
    if Path("gates.yaml").is_file():
        return Path("gates.yaml")
    return Path(__file__).resolve().parents[1] / "gates.yaml"


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
        if gate.metric not in catalog:
            hint = did_you_mean(gate.metric, catalog)
            problems.append(Problem(f"unknown metric '{gate.metric}': no stage produces it",
                                    file=str(path), field=f"gates.{i}.metric",
                                    fix=hint.strip() or "run `day0 metrics` to list the metrics"))
        if not all(math.isfinite(t) for t in (gate.threshold, *gate.by_claim.values())):
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
             inapplicable: dict[str, str] | None = None) -> list[GateResult]:
    """Judge every gate. missing_reasons maps a metric prefix (stage) to why it is absent
    (e.g. "failed: <error>", "not run: analysis failed");
    claim selects by_claim thresholds (the target's claim); inapplicable maps a metric prefix
    (a stage that does not run on this kind of target) to why its gates do not apply."""
    results = []
    for gate in gates.gates:
        threshold = gate.by_claim.get(claim, gate.threshold)
        base = dict(id=gate.id, metric=gate.metric, op=gate.op, threshold=threshold,
                    severity=gate.severity)
        why_not = next((r for prefix, r in (inapplicable or {}).items()
                        if gate.metric.startswith(prefix + ".")), None)
        if why_not:
            results.append(GateResult(**base, observed=None, passed=True, applicable=False,
                                      reason=f"not applicable: {why_not}"))
            continue
        if gate.applies_to != "all" and (gate.applies_to == "moe") != is_moe:
            kind = "MoE" if is_moe else "dense"
            results.append(GateResult(**base, observed=metrics.get(gate.metric), passed=True,
                                      applicable=False,
                                      reason=f"not applicable: {kind} model, gate is for {gate.applies_to}"))
            continue
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
        passed = OPS[gate.op](observed, threshold)
        relation = "holds" if passed else "violated"
        results.append(GateResult(**base, observed=observed, passed=passed,
                                  reason=f"{observed:.6g} {gate.op} {threshold:g} {relation}"
                                  + (f" ({claim} claim)" if claim in gate.by_claim else "")))
    return results


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
