"""Agreement of two runs of the prompt set: tokens as vLLM's tests compare them, plus logprobs.

Per prompt, :func:`day0.engines.greedy.compare_greedy`: the greedy tokens must agree up to
their first difference, and there each side's token must be in the other's top-k (a near tie
flipped by rounding); after it nothing is compared. Over the tokens both sides share, the
largest |logprob a - logprob b| of the chosen token must stay within the tolerance: a serving
feature that changes the numbers (a lossy KV cache, a wrong chunk boundary, a stale cached
block) moves the logprobs before it flips any token.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from day0.execution.contract import Row
from day0.engines.greedy import Step, compare_greedy


class PromptAgreement(Row):
    prompt: int = Field(description="Index in the prompt set.")
    tokens: int = Field(description="Tokens compared.")
    matched: int = Field(description="Tokens equal before the first difference.")
    first_difference: int | None = Field(None, description="First differing position, or None.")
    close: bool = Field(description="compare_greedy's verdict (identical, or a near tie).")
    max_logprob_diff: float = Field(description="Largest |Δlogprob| of the matched tokens.")
    why: str = Field("", description="Why not close.")


class Agreement(BaseModel):
    """One run of the prompt set against another (the baseline)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    label: str = Field(description="What was compared with the baseline.")
    prompts: int = Field(description="Prompts compared.")
    not_close: int = Field(description="Prompts whose tokens part beyond a near tie.")
    diverged: int = Field(description="Prompts that part at a near tie (close, compared up to "
                                      "the difference only).")
    tokens_compared: int = Field(description="Matched tokens whose logprobs were compared.")
    max_logprob_diff: float = Field(description="Largest |Δlogprob| over every matched token "
                                                "(NaN when a side gave a non-finite one).")
    over_tolerance: bool = Field(description="max_logprob_diff above the tolerance (or NaN).")
    rows: list[PromptAgreement] = Field(description="Per prompt.")

    @property
    def passed(self) -> bool:
        return self.not_close == 0 and not self.over_tolerance

    def problems(self, tolerance: float) -> list[str]:
        out: list[str] = []
        if self.not_close:
            first = next(r for r in self.rows if not r.close)
            out.append(f"{self.label}: {self.not_close}/{self.prompts} prompts not close to the "
                       f"baseline (prompt {first.prompt}, {first.why})")
        if self.over_tolerance:
            out.append(f"{self.label}: max |Δlogprob| {self.max_logprob_diff:.4g} > tolerance "
                       f"{tolerance:g}")
        return out


def worst(values) -> float:
    """The largest value, NaN winning (a NaN must never hide behind a finite maximum)."""
    return max(values, default=0.0, key=lambda v: math.inf if math.isnan(v) else v)


def _diff(a: list[Step], b: list[Step], upto: int) -> float:
    """compare_greedy's max_logprob_diff, but NaN when a matched logprob is not finite (a NaN
    must not pass a tolerance by comparing False)."""
    largest = 0.0
    for (tok_a, top_a), (_, top_b) in zip(a[:upto], b[:upto]):
        if tok_a in top_a and tok_a in top_b:
            x, y = top_a[tok_a], top_b[tok_a]
            if not (math.isfinite(x) and math.isfinite(y)):
                return math.nan
            largest = max(largest, abs(x - y))
    return largest


def agreement(label: str, baseline: list[list[Step]], other: list[list[Step]],
              tolerance: float) -> Agreement:
    """Compare prompt by prompt (same order, same count)."""
    if len(baseline) != len(other):
        raise ValueError(f"{label}: {len(other)} results for {len(baseline)} prompts")
    rows: list[PromptAgreement] = []
    for index, (a, b) in enumerate(zip(baseline, other)):
        result = compare_greedy(a, b)
        rows.append(PromptAgreement(prompt=index, tokens=result.tokens,
                                    matched=result.matched_prefix,
                                    first_difference=result.first_difference,
                                    close=result.close,
                                    max_logprob_diff=_diff(a, b, result.matched_prefix),
                                    why=result.why))
    largest = worst(r.max_logprob_diff for r in rows)
    return Agreement(label=label, prompts=len(rows), not_close=sum(not r.close for r in rows),
                     diverged=sum(r.close and r.first_difference is not None for r in rows),
                     tokens_compared=sum(r.matched for r in rows), max_logprob_diff=largest,
                     over_tolerance=not (largest <= tolerance), rows=rows)


__all__ = ["PromptAgreement", "Agreement", "agreement", "worst"]
