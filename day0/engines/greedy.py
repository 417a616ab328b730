"""Greedy sequences compared the way vLLM's tests compare them (``check_logprobs_close``).

Two greedy runs of the same prompt may legitimately part where two tokens are nearly tied: a
rounding difference flips the argmax and the texts diverge from there. So, as in
vllm/tests/models/utils.py::check_logprobs_close, the sequences must agree up to their first
differing token, and at that position each side's token must be among the other side's top-k
log-probabilities; after it, nothing is compared (the contexts differ). Where both agree, the
log-probabilities of the shared tokens are compared too (``max_logprob_diff``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# one generated step: (chosen token id, {token id: logprob} of the top-k at that step)
Step = tuple[int, dict[int, float]]


class GreedyComparison(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    tokens: int = Field(description="Tokens compared (the shorter sequence's length).")
    first_difference: int | None = Field(description="Index of the first differing token, or None.")
    close: bool = Field(description=(
        "Identical, or at the first difference each token is in the other side's top-k."))
    matched_prefix: int = Field(description="Tokens equal before the first difference.")
    max_logprob_diff: float = Field(description=(
        "Largest |logprob a - logprob b| of the chosen token over the matched prefix (0 when "
        "a side gave no logprob for it)."))
    why: str = Field("", description="Why not close (the two tokens and their ranks).")
    tie_gap: float | None = Field(None, description=(
        "At the first difference: the larger of the two sides' logprob margins between their "
        "own token and the other side's (a near-tie has a small one); None without a "
        "difference or when a token is missing from a top-k."))


def compare_greedy(a: list[Step], b: list[Step], max_gap: float | None = None) -> GreedyComparison:
    """a and b: the two sides' steps; a side that stopped early is compared over the shorter.
    max_gap: also require the first difference to be a near-tie, each side's margin between its
    own token and the other's at most max_gap nats (None: top-k membership alone, as vLLM)."""
    count = min(len(a), len(b))
    diff = 0.0
    for index in range(count):
        (tok_a, top_a), (tok_b, top_b) = a[index], b[index]
        if tok_a != tok_b:
            inside = tok_a in top_b and tok_b in top_a
            gap = max(top_a[tok_a] - top_a[tok_b], top_b[tok_b] - top_b[tok_a]) if (
                inside and tok_a in top_a and tok_b in top_b) else None
            close = inside and (max_gap is None or gap is not None and gap <= max_gap)
            why = "" if close else (
                f"position {index}: {tok_a} vs {tok_b}; "
                f"{tok_a} {'in' if tok_a in top_b else 'not in'} the other's top-{len(top_b)}, "
                f"{tok_b} {'in' if tok_b in top_a else 'not in'} the other's top-{len(top_a)}"
                + (f"; margin {gap:.3f} nats > {max_gap}" if inside and gap is not None else ""))
            return GreedyComparison(tokens=count, first_difference=index, close=close,
                                    matched_prefix=index, max_logprob_diff=diff, why=why,
                                    tie_gap=gap)
        if tok_a in top_a and tok_b in top_b:
            diff = max(diff, abs(top_a[tok_a] - top_b[tok_b]))
    return GreedyComparison(tokens=count, first_difference=None, close=True,
                            matched_prefix=count, max_logprob_diff=diff)


__all__ = ["Step", "GreedyComparison", "compare_greedy"]
