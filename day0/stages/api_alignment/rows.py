"""Table rows of the api_alignment result (kept apart from the core: the report hooks read the
result as JSON and never import torch)."""

from __future__ import annotations

from pydantic import Field

from day0.execution.contract import Row


class BucketRow(Row):
    bucket: int = Field(description="Bucket index (0 = the first positions).")
    start: int = Field(description="First position in the bucket.")
    end: int = Field(description="One past the last position in the bucket.")
    positions: int = Field(description="Scored positions in this bucket over all windows.")
    kl_topk_mean: float | None = Field(description="Engine: mean truncated KL, nats.")
    control_kl_topk_mean: float | None = Field(None, description="Control: the same.")
    kl_topk_ratio: float | None = Field(None, description="Engine / control (control floored).")
    kl_topk_ratio_low: float | None = Field(None, description="95 % lower bound of that ratio.")
    top1_agreement: float | None = Field(description="Engine: top-1 agreement.")
    control_top1_agreement: float | None = Field(None, description="Control: the same.")


class GenerationRow(Row):
    prompt_start: int = Field(description="Token offset of the prompt in the evaluation text.")
    prompt_tokens: int = Field(description="Prompt length, tokens (start token excluded).")
    tokens: int = Field(description="Generated tokens compared.")
    close: bool = Field(description=(
        "Engine vs reference: identical, or at the first difference each token is in the "
        "other's top-k (vLLM check_logprobs_close)."))
    first_difference: int | None = Field(description="First differing generated position.")
    matched_prefix: int = Field(description="Generated tokens equal before it.")
    max_logprob_diff: float = Field(description=(
        "Largest |engine - reference| logprob of the chosen token over the matched prefix."))
    why: str = Field("", description="Why not close.")
    control_close: bool = Field(description="Control vs reference, the same test.")
    control_first_difference: int | None = Field(None, description="The control's.")
    reference_text: str = Field(description="Reference continuation (decoded).")
    engine_text: str = Field(description="Engine continuation (decoded).")
    nonfinite: int = Field(0, description="NaN/inf logprobs the engine returned here.")


__all__ = ["BucketRow", "GenerationRow"]
