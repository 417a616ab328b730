"""The alignment stage's settings (Config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Config(BaseModel):
    """Settings of the alignment stage."""

    model_config = ConfigDict(extra="forbid")

    text_file: str | None = Field(None, description=(
        "UTF-8 evaluation text. Default: heldout.txt in the checkpoint folder if present, else "
        "day0's built-in text (day0/data/eval_text.txt)."))
    seq_len: int | None = Field(None, ge=3, description=(
        "Positions per evaluation window. Default: the model's max_position_embeddings, capped "
        "at seq_len_cap, so windows reach the far end of the trained context."))
    seq_len_cap: int = Field(8192, ge=3, description=(
        "Upper bound of the default seq_len (CPU time grows with it; the report gives the "
        "covered fraction of the trained context)."))
    max_windows: int = Field(4, ge=1, description="Evaluation windows (non-overlapping).")
    context_tokens: int = Field(8, ge=1, description=(
        "Leading positions of each window (start token included) that are context only, never "
        "scored: every scored position has real text before it."))
    chunk_tokens: int = Field(1024, ge=16, description=(
        "A longer window runs in chunks of this many positions over a KV cache (bounds memory)."))
    position_buckets: int = Field(4, ge=1, description=(
        "Equal position ranges that layer and logit errors are reported and gated by."))
    check_ops: bool = Field(True, description="Run the per-operator replay.")
    op_tokens: int = Field(32, ge=1, description="Input tokens of the forward whose ops are replayed.")
    reference_inputs: Literal["rounded", "float32"] = Field("rounded", description=(
        "Per-op reference inputs: 'rounded' to the target dtype (isolates kernel error) or "
        "'float32' as recorded. Discrete ops always use rounded inputs."))
    check_weights: bool = Field(True, description=(
        "Scan every weight of the checkpoint (non-finite, zeroed, constant, corrupted values) "
        "and the reference perplexity's plausibility: a broken checkpoint is its own verdict."))
    generation_prompts: int = Field(4, ge=0, description="Prompts for greedy generation.")
    prompt_tokens: int = Field(16, ge=1, description="Tokens per generation prompt.")
    new_tokens: int = Field(32, ge=1, description="Tokens generated per prompt.")
    tolerance_file: str | None = Field(None, description=(
        "Tolerances YAML replacing day0/data/tolerances.yaml (same schema)."))
    streaming: Literal["auto", "on", "off"] = Field("auto", description=(
        "Run reference, control and an in-process target layer by layer, each layer's weights "
        "read from the shards when needed (peak memory: about one layer, not the model). "
        "'auto': stream when the resident copies would not fit in the available memory."))
    expert_group_gib: float = Field(1.0, gt=0, description=(
        "Streaming: MoE experts routed to are read this many GiB at a time."))
    reference_bank: Literal["use", "refresh", "off"] = Field("use", description=(
        "The reference bank (what reference and control computed on these windows, keyed by "
        "weights, windows, settings and versions): 'use' replays it when present and stores "
        "it when computed; 'refresh' recomputes and replaces it; 'off' neither reads nor "
        "writes."))
    reference_bank_max_gib: float = Field(16.0, gt=0, description=(
        "Largest bank a run stores (float32 logits and every layer's output per position: "
        "Llama-3.1-8B at the defaults takes ~32 GiB, ~48 with a bf16 control); a larger one "
        "is computed but not stored, said in the log."))
    reference_bank_uri: str | None = Field(None, description=(
        "Where banks are kept (s3://BUCKET/PREFIX or a folder). Default: "
        "$DAY0_REFERENCE_BANK_URI, else <results>/<model>/<revision>/reference-cpu-float32/"
        "alignment-bank next to the targets' results ($DAY0_RESULTS_URI, or the s3 source's "
        "bucket), else the local cache."))


__all__ = ["Config"]
