"""Resource budgets of a stage: memory and wall-clock time, explicit or derived from the model.

A target's ``memory_limit_gib`` / ``timeout_s`` win when set. Otherwise each stage's budget is
derived from the analysis stage's parameter count, the dtypes of the model copies the stage
holds and its factors (its folder's ``budget.yaml``; the formula: ``day0/data/budgets.yaml``).
The runner kills a stage over its budget and reports why (``StageBudget.exceeded``): verdict
ERROR, never a worker exhausted by one oversized checkpoint.
"""

from __future__ import annotations

import math

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from day0.execution import lifecycle
from day0.errors import ConfigError
from day0.execution.targets import REFERENCE, Target
from day0.yamlio import load_model, read_mapping

BUDGETS_FILE = Path(__file__).parents[1] / "data" / "budgets.yaml"
BUDGETS_ENV = "DAY0_BUDGETS"  # another factors file, e.g. tuned for a worker's hardware
Copy = Literal["reference", "control", "target"]


class StageFactors(BaseModel):
    """How one stage's budget grows with the model."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field("", description="What the stage holds in memory (documentation).")
    copies: list[Copy] = Field(default_factory=list, description=(
        "Model copies the stage holds at once: 'reference' in the reference dtype, 'control' "
        "and 'target' in the target's dtype; each costs params x bytes per dtype."))
    activation_factor: float = Field(1.0, ge=1.0, description=(
        "Multiplier on the copies' bytes for activations, KV cache and allocator slack."))
    fixed_gib: float = Field(gt=0, description=(
        "Allowance independent of the model: interpreter, torch, transformers, tokenizer."))
    fixed_s: float = Field(gt=0, description="Time allowance independent of the model, seconds.")
    seconds_per_billion_params: float = Field(0.0, ge=0, description=(
        "Time per billion parameters on top of fixed_s."))
    seconds_per_billion_params_per_item: float = Field(0.0, ge=0, description=(
        "Time per billion parameters for each item its config adds (Stage.work: e.g. "
        "benchmark questions), both sides together."))
    seconds_per_billion_params_per_generated_token: float = Field(0.0, ge=0, description=(
        "Time per billion parameters for each token its config has it generate (Stage.work)."))
    context_cap_tokens: int = Field(0, ge=0, description=(
        "Most positions the stage evaluates at once (the model's context, capped here; the "
        "stage config's seq_len / seq_len_cap win); 0: memory does not grow with the context."))
    chunk_tokens: int = Field(1024, ge=1, description=(
        "Positions whose logits the stage holds at once (the stage config's chunk_tokens wins)."))
    bytes_per_token_layer_hidden: float = Field(0.0, ge=0, description=(
        "Bytes per evaluated position x layer x hidden size, all model copies together "
        "(KV cache and per-layer hidden states)."))
    bytes_per_chunk_token_vocab: float = Field(0.0, ge=0, description=(
        "Bytes per chunk position x vocabulary entry, all copies together (logits, "
        "log-softmax and their temporaries)."))


class BudgetFactors(BaseModel):
    """day0/data/budgets.yaml (or $DAY0_BUDGETS): the global factors, and stages it overrides."""

    model_config = ConfigDict(extra="forbid")

    host_memory_fraction: float = Field(0.8, gt=0, le=1, description=(
        "A derived memory budget is capped at this fraction of the host's memory."))
    bytes_per_dtype: dict[str, float] = Field(description="Bytes per parameter of each dtype.")
    stages: dict[str, StageFactors] = Field(default_factory=dict, description=(
        "Factors per stage name that replace the stage's own budget.yaml (a worker's tuning)."))


class StageBudget(BaseModel):
    """The memory and time a stage may use, and where each figure came from (in the report)."""

    model_config = ConfigDict(extra="forbid")

    memory_gib: float = Field(gt=0, description="Resident-memory limit of the stage, GiB.")
    timeout_s: float = Field(gt=0, description="Wall-clock limit of the stage, seconds.")
    memory_explicit: bool = Field(description="memory_gib is the target's memory_limit_gib.")
    timeout_explicit: bool = Field(description="timeout_s is the target's timeout_s.")
    params: int | None = Field(None, description=(
        "Parameter count the derived figures come from; None before analysis has counted."))
    memory_basis: str = Field(description="How memory_gib was obtained, in words.")
    timeout_basis: str = Field(description="How timeout_s was obtained, in words.")

    def exceeded(self, stage: str, kind: Literal["memory", "time"]) -> str:
        """The one-line reason of a stage killed for going over this budget."""
        if kind == "memory":
            if self.memory_explicit:
                return (f"stage '{stage}' exceeded its memory limit of {self.memory_gib:g} GiB "
                        f"({self.memory_basis}) and was killed")
            return (f"stage {stage} exceeded its memory budget of {self.memory_gib:g} GiB "
                    f"{self.memory_basis}; set memory_limit_gib in the target file to raise it")
        if self.timeout_explicit:
            return (f"stage '{stage}' exceeded its timeout of {self.timeout_s:g} s "
                    f"({self.timeout_basis}) and was killed")
        return (f"stage {stage} exceeded its time budget of {self.timeout_s:g} s "
                f"{self.timeout_basis}; set timeout_s in the target file to raise it")


def stage_memory_bytes() -> int | None:
    """The memory budget of the stage this process runs (its runner says so in MEMORY_ENV), for
    a stage that sizes its work to it; None outside a stage runner or when unreadable."""
    try:
        gib = float(os.environ.get(lifecycle.MEMORY_ENV, ""))
    except ValueError:
        return None
    return int(gib * 2**30) if gib > 0 else None


def load_factors(path: str | None = None) -> BudgetFactors:
    """The budget factors: path, else $DAY0_BUDGETS, else the shipped day0/data/budgets.yaml."""
    return _load_factors(str(path or os.environ.get(BUDGETS_ENV) or BUDGETS_FILE))


@lru_cache(maxsize=8)
def _load_factors(file: str) -> BudgetFactors:
    return load_model(BudgetFactors, read_mapping(file), file)


def stage_factors(stage: str, factors: BudgetFactors | None = None) -> StageFactors:
    """The stage's budget factors: the factors file's entry for it, else the stage's own
    budget.yaml; a stage that declares none is a ConfigError (exit 2) naming the file."""
    from day0 import stages

    factors = factors or load_factors()
    if stage in factors.stages:
        return factors.stages[stage]
    path = stages.get(stage).budget_file
    if not path.is_file():
        raise ConfigError(f"stage '{stage}' declares no resource budget", file=str(path),
                          field="budget", fix="add budget.yaml to the stage's folder (or name "
                          "one as its budget_name); day0/data/budgets.yaml explains the factors")
    return _stage_factors(str(path))


@lru_cache(maxsize=64)
def _stage_factors(file: str) -> StageFactors:
    return load_model(StageFactors, read_mapping(file), file)


def format_params(n: int) -> str:
    """134_515_008 -> '134.5M' (as people quote model sizes)."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def host_memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


class ModelShape(BaseModel):
    """The dimensions of the analysis result a context-dependent budget needs."""

    num_layers: int = Field(0, ge=0, description="Decoder layers.")
    hidden_size: int = Field(0, ge=0, description="Hidden size.")
    vocab_size: int = Field(0, ge=0, description="Vocabulary size.")
    max_context: int = Field(0, ge=0, description="Trained context, positions.")


def shape_of(facts: dict) -> ModelShape | None:
    """The model's dimensions from the model facts earlier stages found (StageSpec.facts)."""
    values = {k: facts.get(k) for k in ModelShape.model_fields}
    if not all(isinstance(v, int) and v >= 0 for v in values.values()):
        return None
    return ModelShape(**values)


def context_gib(f: StageFactors, shape: ModelShape | None, stage_config: dict | None = None) -> float:
    """Memory that grows with the evaluated context rather than with the parameter count; the
    stage config's seq_len / seq_len_cap / chunk_tokens (alignment's) win over the defaults."""
    if not shape or not f.context_cap_tokens:
        return 0.0
    config = stage_config or {}
    cap = _positive(config.get("seq_len_cap")) or f.context_cap_tokens
    tokens = _positive(config.get("seq_len")) or min(shape.max_context or cap, cap)
    chunk = min(tokens, _positive(config.get("chunk_tokens")) or f.chunk_tokens)
    return (tokens * shape.num_layers * shape.hidden_size * f.bytes_per_token_layer_hidden
            + chunk * shape.vocab_size * f.bytes_per_chunk_token_vocab) / 2**30


def _positive(value) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def work_of(stage: str, stage_config: dict | None):
    """What the stage's config asks beyond its default work (Stage.work); none for a stage the
    registry does not know or a config it cannot read."""
    from day0 import stages
    from day0.execution.contract import Work

    try:
        return stages.get(stage).work(stage_config or {})
    except Exception:  # the config check reports a bad config; an unknown stage is refused there
        return Work()


def params_of(facts: dict) -> int | None:
    """params.total from the model facts earlier stages found (StageSpec.facts), if any."""
    total = (facts.get("params") or {}).get("total")
    return int(total) if isinstance(total, (int, float)) and total > 0 else None


def derive(stage: str, target: Target, params: int | None, *, reference: Target = REFERENCE,
           shape: ModelShape | None = None, stage_config: dict | None = None,
           factors: BudgetFactors | None = None,
           timeout_s: float | None = None, memory_limit_gib: float | None = None) -> StageBudget:
    """The stage's budget: explicit limits (arguments, else the target's fields) win, the rest is
    derived from params and, for stages whose memory grows with the context, from the model's
    shape; without params only the fixed allowances apply."""
    factors = factors or load_factors()
    memory_from = ("set by the caller" if memory_limit_gib else
                   f"memory_limit_gib of target {target.name}")
    timeout_from = "set by the caller" if timeout_s else f"timeout_s of target {target.name}"
    memory_limit_gib = memory_limit_gib or target.memory_limit_gib
    timeout_s = timeout_s or target.timeout_s
    # explicit limits need no factors (a stage run by hand with both given)
    f = None if memory_limit_gib and timeout_s else stage_factors(stage, factors)
    size = (f"derived from {format_params(params)} parameters" if params else
            f"(the {stage} stage's fixed allowance; no parameter count yet)")

    if memory_limit_gib:
        memory, memory_basis = float(memory_limit_gib), memory_from
    else:
        dtypes = {"reference": reference.dtype, "control": target.dtype, "target": target.dtype}
        per_param = sum(factors.bytes_per_dtype[dtypes[c]] for c in f.copies)
        extra = context_gib(f, shape, stage_config) if params else 0.0
        memory = round((params or 0) * per_param * f.activation_factor / 2**30 + extra
                       + f.fixed_gib, 2)
        memory_basis = size + (f" and {extra:.1f} GiB for its context" if extra >= 0.05 else "")
        host = host_memory_gib()
        if host and memory > host * factors.host_memory_fraction:
            # rounded down: a cap rounded up would exceed the fraction it promises
            memory = math.floor(host * factors.host_memory_fraction * 100) / 100
            memory_basis += f", capped at {factors.host_memory_fraction:.0%} of this host's memory"
    if timeout_s:
        timeout, timeout_basis = float(timeout_s), timeout_from
    else:
        work = work_of(stage, stage_config)
        billions = (params or 0) / 1e9
        run_for = work.seconds + billions * (
            f.seconds_per_billion_params_per_item * work.items
            + f.seconds_per_billion_params_per_generated_token * work.generated_tokens)
        timeout = round(f.fixed_s + f.seconds_per_billion_params * billions + run_for, 1)
        asked = ", ".join(part for part in (
            f"{work.seconds:g} s configured" if work.seconds else "",
            f"{work.items} items" if work.items else "",
            f"{work.generated_tokens} generated tokens" if work.generated_tokens else "") if part)
        timeout_basis = size + (f" plus {run_for:.0f} s for its configured work ({asked})"
                                if run_for else "")
    return StageBudget(memory_gib=memory, timeout_s=timeout,
                       memory_explicit=bool(memory_limit_gib), timeout_explicit=bool(timeout_s),
                       params=params, memory_basis=memory_basis, timeout_basis=timeout_basis)


def for_spec(spec, **explicit) -> StageBudget:
    """derive() for a StageSpec: its stage, target, reference and the model facts it carries."""
    inputs = spec.inputs
    return derive(spec.stage, inputs.target, params_of(spec.facts),
                  reference=inputs.reference, shape=shape_of(spec.facts),
                  stage_config=spec.config, **explicit)


def with_budget(target: Target, budget: StageBudget) -> Target:
    """The target with the budget's figures as explicit limits (for runners that read them)."""
    return target.model_copy(update={"timeout_s": budget.timeout_s,
                                     "memory_limit_gib": budget.memory_gib})


__all__ = ["StageBudget", "ModelShape", "shape_of", "BudgetFactors", "BUDGETS_ENV", "derive", "for_spec", "with_budget",
           "load_factors", "stage_factors", "format_params"]
