"""One launch variant: start it, run the prompt set, compare with the baseline, prove the
feature was exercised.

What a variant claims to turn on is read from its name and arguments:

* prefix caching (name contains "prefix", or ``--enable-prefix-caching``): the prompt set is
  sent twice (the second pass finds every prompt's full KV blocks cached; the shared prefix
  lets prompts hit each other's blocks in the first pass) and both passes are compared with
  the baseline. The prefix-cache counter (``engine.prefix_cache_metric``) must grow: a variant
  whose cache never hit compared nothing (the engine may have turned caching off, as vLLM for
  CPU does for MLA models) and fails as vacuous.
* a token budget (``--max-num-batched-tokens N``, or a name with "chunk"): some prompt must be
  longer than N, so the scheduler (at most N tokens per step) has to split its prefill. A
  "chunk" variant without a budget, or whose budget no prompt exceeds, fails as vacuous. (vLLM
  has no metric of prefill chunks: ``vllm:iteration_tokens_total`` counts a prompt's tokens at
  the step that finishes its prefill, so it cannot show the split.)
"""

from __future__ import annotations

import time
from typing import Callable

from pydantic import Field

from day0.execution.contract import Row
from day0.engines.client import EngineClient
from day0.engines.greedy import Step
from day0.stages.serving.compare import Agreement, agreement, worst
from day0.stages.serving.runs import counter_value, generate, settled

BUDGET_FLAG = "--max-num-batched-tokens"


class VariantRow(Row):
    name: str = Field(description="The variant's name (engine.variants).")
    args: list[str] = Field(description="Extra engine arguments it is launched with.")
    features: list[str] = Field(description="What it was checked for: prefix-caching, "
                                            "token-budget (chunked prefill).")
    ready_s: float | None = Field(None, description="Seconds it took to answer.")
    passes: list[Agreement] = Field(description="Each pass of the prompt set vs the baseline.")
    not_close: int = Field(description="Prompts not close to the baseline, over all passes.")
    max_logprob_diff: float = Field(description="Largest |Δlogprob| over all passes.")
    prefix_cache_hits: float | None = Field(None, description=(
        "Growth of engine.prefix_cache_metric over both passes (tokens served from the cache, "
        "for vLLM); None when it is not a prefix-caching variant."))
    prefix_cache_hits_second_pass: float | None = Field(None, description=(
        "The same over the second pass only."))
    token_budget: int | None = Field(None, description="Its --max-num-batched-tokens, if any.")
    prompts_over_budget: int | None = Field(None, description="Prompts longer than the budget "
                                                              "(what chunked prefill splits).")
    vacuous: bool = Field(False, description="The feature was not shown to be exercised.")
    passed: bool = Field(description="Close, within tolerance and not vacuous.")
    reasons: list[str] = Field(default_factory=list, description="Why it failed.")


def token_budget(args: list[str]) -> int | None:
    """The value of --max-num-batched-tokens in args (``--flag N`` or ``--flag=N``)."""
    for index, arg in enumerate(args):
        value = None
        if arg == BUDGET_FLAG and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(BUDGET_FLAG + "="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def is_prefix(name: str, args: list[str]) -> bool:
    return "prefix" in name.lower() or "--enable-prefix-caching" in args


def is_chunked(name: str, args: list[str]) -> bool:
    return "chunk" in name.lower() or token_budget(args) is not None


def features(name: str, args: list[str]) -> list[str]:
    return ((["prefix-caching"] if is_prefix(name, args) else [])
            + (["token-budget"] if is_chunked(name, args) else []))


def check(name: str, args: list[str], client: EngineClient, served: str,
          prompts: list[list[int]], baseline: list[list[Step]], *, new_tokens: int, top_k: int,
          tolerance: float, cache_metric: str,
          ready_s: float | None = None, log: Callable[[str], None] = print) -> VariantRow:
    """Run the prompt set on a running variant and judge it."""
    prefix, chunked, budget = is_prefix(name, args), is_chunked(name, args), token_budget(args)
    before = settled(client, interval_s=0.2, tries=2) if prefix else None
    passes: list[Agreement] = []
    hits: list[float | None] = []
    for number in range(2 if prefix else 1):
        started = time.monotonic()
        steps = generate(client, served, prompts, new_tokens, top_k)
        label = f"{name} pass {number + 1}" if prefix else name
        passes.append(agreement(label, baseline, steps, tolerance))
        hits.append(counter_value(settled(client), cache_metric) if prefix else None)
        log(f"[serving] {label}: {len(prompts)} prompts in {time.monotonic() - started:.1f} s, "
            f"{passes[-1].not_close} not close, max |Δlogprob| {passes[-1].max_logprob_diff:.4g}")
    reasons = [p for a in passes for p in a.problems(tolerance)]
    row = VariantRow(name=name, args=list(args), features=features(name, args), ready_s=ready_s,
                     passes=passes, not_close=sum(a.not_close for a in passes),
                     max_logprob_diff=worst(a.max_logprob_diff for a in passes),
                     token_budget=budget, passed=False)
    vacuous: list[str] = []
    if prefix:
        start = counter_value(before, cache_metric)
        if start is None or hits[-1] is None:
            vacuous.append(f"the engine does not export {cache_metric} (engine."
                           "prefix_cache_metric): the prefix cache cannot be shown to hit")
        else:
            row.prefix_cache_hits = hits[-1] - start
            row.prefix_cache_hits_second_pass = hits[-1] - hits[0]
            if row.prefix_cache_hits <= 0:
                vacuous.append(f"the prefix cache never hit ({cache_metric} did not grow over "
                               "two passes): the comparison is vacuous; is prefix caching on "
                               "for this model and engine?")
    if chunked:
        if budget is None:
            vacuous.append(f"its name says chunked prefill but it sets no {BUDGET_FLAG}: the "
                           "engine's default budget need not split any prompt")
        else:
            row.prompts_over_budget = sum(len(p) > budget for p in prompts)
            if not row.prompts_over_budget:
                vacuous.append(f"no prompt is longer than its budget of {budget} tokens: "
                               "nothing was split (use longer prompts)")
    row.vacuous = bool(vacuous)
    row.reasons = reasons + [f"vacuous: {v}" for v in vacuous]
    row.passed = not row.reasons
    return row


__all__ = ["VariantRow", "check", "token_budget", "is_prefix", "is_chunked", "features"]
