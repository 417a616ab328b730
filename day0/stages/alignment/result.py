"""The alignment stage's evidence (Result) and its flat gate inputs (Result.metrics)."""

from __future__ import annotations

import math

from pydantic import ConfigDict, Field

from day0.execution.contract import StageResult
from day0.stages.alignment import generation as gen
from day0.stages.alignment.layers import LayerRow, RouterRow
from day0.stages.alignment.logits import BucketRow
from day0.torchkit.paired import Comparison
from day0.torchkit.replay import OpRow

OP_CHECK_SCOPE = (
    "Each aten op of a short reference forward is replayed on the target device at the target "
    "dtype from the recorded inputs and compared with float32. This exercises the target's "
    "device kernels for those aten ops, including torch.library overrides a plugin registered "
    "globally; it does NOT exercise model-level changes a plugin makes (replaced module "
    "forwards, fused or custom ops, quantized weights): those are judged by the layer, logit "
    "and perplexity comparisons, which run the target exactly as it is.")


class Result(StageResult):
    """Evidence of the alignment stage; metrics() gives the flat gate inputs."""

    # NaN/inf are findings: keep them in JSON instead of turning them into null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    target: str = Field(description="Target label (name, device, dtype).")
    claim: str = Field("faithful", description="The target's numerics claim (selects bounds).")
    control: str = Field(description="What the control is: reference device, target dtype.")
    target_is_control: bool = Field(description=(
        "The target is the control itself (same device and dtype, no plugins): relative gates "
        "compare it with itself and the absolute bounds decide."))
    plugins: list[str] = Field(default_factory=list, description="Plugins applied to the target.")
    text_file: str = Field(description="Evaluation text used.")
    text_tokens: int = Field(0, description="Tokens of the evaluation text.")
    seq_len: int = Field(description="Positions per window (start token included).")
    prefix_token: int | None = Field(None, description="Start token of every window (BOS/EOS).")
    context_tokens: int = Field(0, description="Leading positions per window not scored.")
    max_position_embeddings: int | None = Field(None, description="The model's trained context.")
    covered_fraction: float | None = Field(None, description=(
        "Furthest scored position + 1 over the trained context."))
    windows: int = Field(description="Windows evaluated.")
    positions: int = Field(description="Scored positions (logit level) over all windows.")
    op_check_scope: str = Field(OP_CHECK_SCOPE, description="What the op check covers.")
    ops: list[OpRow] = Field(default_factory=list, description="Per-operator replay table.")
    layers: list[LayerRow] = Field(description="Per-decoder-layer error, target vs control.")
    first_divergent_layer: int | None = Field(description=(
        "First layer whose error departs from the control's beyond the bound, or None."))
    buckets: list[BucketRow] = Field(description="Logit agreement per position bucket.")
    comparisons: list[Comparison] = Field(default_factory=list, description=(
        "Target vs control, paired: the statistics the relative gates read."))
    kl_mean: float = Field(description="Mean over scored positions of KL(ref||target), nats.")
    kl_p99: float = Field(description="99th percentile over scored positions of KL, nats.")
    kl_max: float = Field(description="Largest per-position KL, nats.")
    kl_max_bucket: float = Field(description="Largest per-bucket mean KL, nats.")
    top1_agreement: float = Field(description="Fraction of positions with the same argmax.")
    control_kl_mean: float = Field(math.nan, description="Mean KL(ref||control), nats.")
    control_kl_p99: float = Field(math.nan, description="99th percentile of KL(ref||control).")
    control_kl_max: float = Field(math.nan, description="Largest per-position KL(ref||control).")
    control_top1_agreement: float = Field(math.nan, description="Control's top-1 agreement.")
    routers: list[RouterRow] | None = Field(None, description="Per-router agreement (MoE).")
    expert_agreement: float | None = Field(None, description=(
        "Mean Jaccard index of selected expert sets per token and router (None: dense)."))
    control_expert_agreement: float | None = Field(None, description="The control's.")
    expert_exact_match: float | None = Field(None, description=(
        "Fraction of token routings with the identical expert set (None: dense)."))
    perplexity_reference: float = Field(description="Reference perplexity on the windows.")
    perplexity_target: float = Field(description="Target perplexity on the windows.")
    perplexity_control: float = Field(math.nan, description="Control perplexity, same windows.")
    perplexity_rel_delta: float = Field(description="|target - reference| / reference.")
    generation: list[gen.GenerationRow] = Field(default_factory=list,
                                                description="Per-prompt greedy comparison.")
    nonfinite: int = Field(description="Non-finite values in target logits and hidden states.")
    notes: list[str] = Field(default_factory=list, description="What limited the evaluation.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds per part.")
    peak_rss_mib: dict[str, float] = Field(default_factory=dict, description=(
        "Peak resident memory per part, MiB (the stage process's own)."))
    streamed: bool = Field(False, description=(
        "Reference, control and target ran layer by layer from the shards."))
    reference_bank: str | None = Field(None, description="The reference bank used (its key).")
    reference_bank_hit: bool = Field(False, description=(
        "The reference was replayed from the bank: no reference forward ran."))
    reference_bank_bytes: int | None = Field(None, description="Size of the bank, bytes.")
    reference_bank_parts: dict[str, str] = Field(default_factory=dict, description=(
        "Each side the bank can hold (reference, control-<dtype>): replayed from the verified "
        "bank, or computed here (and why a stored part was not replayed)."))

    def comparison(self, metric: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.metric == metric), None)

    def metrics(self) -> dict[str, float | None]:
        checked = [o for o in self.ops if o.status != "skipped"]
        ops = bool(self.ops)

        def low(metric):
            found = self.comparison(metric)
            return found.low if found else None

        bucket_lows = [b.kl_ratio_low for b in self.buckets if b.kl_ratio_low is not None]
        gens = self.generation
        return {
            "alignment.ops.checked": float(len(checked)) if ops else None,
            "alignment.ops.failed": (float(sum(o.status in ("failed", "error") for o in checked))
                                     if ops else None),
            "alignment.ops.discrete_mismatches": (
                float(sum(o.status in ("failed", "error") and o.kind == "discrete"
                          for o in checked)) if ops else None),
            "alignment.ops.skipped": float(len(self.ops) - len(checked)) if ops else None,
            "alignment.layers.max_rel_error": nan_max([r.rel_error for r in self.layers]),
            "alignment.layers.max_ratio_low": nan_max([r.ratio_low for r in self.layers]),
            "alignment.layers.diverged": float(sum(r.diverged for r in self.layers)),
            "alignment.logits.kl_mean": self.kl_mean,
            "alignment.logits.kl_p99": self.kl_p99,
            "alignment.logits.kl_max": self.kl_max,
            "alignment.logits.kl_max_bucket": self.kl_max_bucket,
            "alignment.logits.top1_agreement": self.top1_agreement,
            "alignment.control.kl_mean": self.control_kl_mean,
            "alignment.control.top1_agreement": self.control_top1_agreement,
            "alignment.vs_control.kl_mean_ratio": (self.comparison("kl_mean").ratio
                                                   if self.comparison("kl_mean") else None),
            "alignment.vs_control.kl_mean_ratio_low": low("kl_mean"),
            "alignment.vs_control.kl_bucket_ratio_low": nan_max(bucket_lows),
            "alignment.vs_control.top1_disagreement_ratio_low": low("top1_disagreement"),
            "alignment.vs_control.perplexity_ratio_low": low("perplexity"),
            "alignment.vs_control.expert_disagreement_ratio_low": low("expert_disagreement"),
            "alignment.moe.expert_agreement": self.expert_agreement,
            "alignment.perplexity.reference": self.perplexity_reference,
            "alignment.perplexity.target": self.perplexity_target,
            "alignment.perplexity.control": self.perplexity_control,
            "alignment.perplexity.rel_delta": self.perplexity_rel_delta,
            "alignment.generation.token_match_rate": (
                sum(g.match_rate for g in gens) / len(gens) if gens else None),
            "alignment.generation.control_token_match_rate": (
                sum(g.control_match_rate for g in gens) / len(gens) if gens else None),
            "alignment.generation.first_divergence": (
                float(min(g.first_divergence for g in gens)) if gens else None),
            "alignment.coverage.fraction": self.covered_fraction,
            "alignment.nonfinite": float(self.nonfinite),
        }


def nan_max(values: list[float]) -> float | None:
    if not values:
        return None
    return math.nan if any(math.isnan(v) for v in values) else max(values)


__all__ = ["OP_CHECK_SCOPE", "Result", "nan_max"]
