"""The alignment stage's statistics: absolute per side, and paired target vs control."""

from __future__ import annotations

import math

from day0.stages.alignment.logits import BucketRow, bucket_bounds
from day0.stages.alignment.result import nan_max
from day0.torchkit.paired import Blocks, mean_excess, ratios


def summarize(evidence, tolerances, target, span: int, n_buckets: int) -> dict:
    """Absolute statistics per side and the paired target-vs-control comparisons."""
    control = tolerances.control
    floors = control.floors
    blocks = Blocks.build(evidence.column("window_of"), evidence.column("bucket_of"),
                          control.block_size)
    logits = evidence.logits
    summary = logits.summary()
    kl_t, kl_c = logits.column("kl_t"), logits.column("kl_c")
    top1_t, top1_c = logits.column("top1_t"), logits.column("top1_c")
    comparisons = ratios(["kl_mean"], kl_t, kl_c, blocks, floors.kl)
    comparisons += ratios(["top1_disagreement"], (~top1_t.bool()).double(),
                          (~top1_c.bool()).double(), blocks, floors.top1_disagreement)
    has_next = logits.column("has_next").bool()
    kept = Blocks.build(evidence.column("window_of")[has_next],
                        evidence.column("bucket_of")[has_next], control.block_size)
    comparisons.append(mean_excess("perplexity", logits.column("nll_t")[has_next],
                                   logits.column("nll_c")[has_next], kept))
    routed = evidence.routers.positions()
    routers = evidence.routers.rows() or None
    agreement = control_agreement = exact = None
    if routed is not None and routers:
        comparisons += ratios(["expert_disagreement"], routed[0], routed[1], blocks,
                              floors.expert_disagreement)
        tokens = sum(r.tokens for r in routers)
        agreement = sum(r.jaccard * r.tokens for r in routers) / tokens
        control_agreement = sum(r.control_jaccard * r.tokens for r in routers) / tokens
        exact = sum(r.exact * r.tokens for r in routers) / tokens

    bucket_rows = []
    for b, (start, end) in enumerate(bucket_bounds(span, n_buckets)):
        mask = evidence.column("bucket_of") == b
        count = int(mask.sum())
        cmp = ratios([f"kl_mean bucket {b}"], kl_t, kl_c, blocks, floors.kl,
                     blocks.bucket_of_block == b)[0]
        bucket_rows.append(BucketRow(
            bucket=b, start=start, end=end, positions=count,
            kl_mean=kl_t[mask].mean().item() if count else None,
            control_kl_mean=kl_c[mask].mean().item() if count else None,
            kl_ratio=cmp.ratio if count else None, kl_ratio_low=cmp.low if count else None,
            top1_agreement=top1_t[mask].double().mean().item() if count else None,
            control_top1_agreement=top1_c[mask].double().mean().item() if count else None))
    bound = control.layer_ratio[target.claim]
    layer_rows = evidence.layers.rows(blocks, n_buckets,
                                      floors.layer_rel_error[target.dtype], bound)
    first = next((r.layer for r in layer_rows if r.diverged), None)
    bucket_kls = [r.kl_mean for r in bucket_rows if r.kl_mean is not None]
    return dict(
        positions=summary["positions"], layers=layer_rows, first_divergent_layer=first,
        buckets=bucket_rows, comparisons=comparisons, kl_mean=summary["kl_mean"],
        kl_p99=summary["kl_p99"], kl_max=summary["kl_max"],
        kl_max_bucket=nan_max(bucket_kls) if bucket_kls else math.nan,
        top1_agreement=summary["top1_agreement"], control_kl_mean=summary["control_kl_mean"],
        control_kl_p99=summary["control_kl_p99"], control_kl_max=summary["control_kl_max"],
        control_top1_agreement=summary["control_top1_agreement"], routers=routers,
        expert_agreement=agreement, control_expert_agreement=control_agreement,
        expert_exact_match=exact, perplexity_reference=summary["perplexity_reference"],
        perplexity_target=summary["perplexity_target"],
        perplexity_control=summary["perplexity_control"],
        perplexity_rel_delta=summary["perplexity_rel_delta"],
        nonfinite=summary["nonfinite"] + sum(r.nonfinite for r in layer_rows))


__all__ = ["summarize"]
