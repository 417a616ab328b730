"""Logit-level comparison: per-position KL(reference || target), top-1 agreement, perplexity,
all by position bucket so corruption at far positions is localized."""

from __future__ import annotations

import math

import torch
from pydantic import Field

from day0.alignment.base import Row


def bucket_index(length: int, span: int, n_buckets: int) -> torch.Tensor:
    """Bucket of each position 0..length-1 when [0, span) is cut into n_buckets equal parts."""
    return (torch.arange(length) * n_buckets // max(span, 1)).clamp(max=n_buckets - 1)


def bucket_bounds(span: int, n_buckets: int) -> list[tuple[int, int]]:
    """[start, end) positions of each bucket."""
    edges = [-(-b * span // n_buckets) for b in range(n_buckets + 1)]
    return [(edges[b], edges[b + 1]) for b in range(n_buckets)]


class BucketRow(Row):
    bucket: int = Field(description="Bucket index (0 = the first positions).")
    start: int = Field(description="First position in the bucket.")
    end: int = Field(description="One past the last position in the bucket.")
    positions: int = Field(description="Positions evaluated in this bucket over all windows.")
    kl_mean: float | None = Field(description="Mean KL(ref||target) in this bucket, nats.")
    top1_agreement: float | None = Field(description="Fraction of positions with the same argmax.")


class LogitAccumulator:
    def __init__(self):
        self.kl: list[torch.Tensor] = []
        self.top1: list[torch.Tensor] = []
        self.buckets: list[torch.Tensor] = []
        self.nll_ref: list[torch.Tensor] = []
        self.nll_tgt: list[torch.Tensor] = []
        self.nonfinite = 0
        self.reference_nonfinite = 0

    def add(self, ref: torch.Tensor, tgt: torch.Tensor, ids: torch.Tensor,
            bucket_of: torch.Tensor, chunk: int = 64) -> None:
        """ref/tgt: [seq, vocab] logits of one window (CPU); ids: [seq] its tokens."""
        self.nonfinite += int((~torch.isfinite(tgt)).sum())
        self.reference_nonfinite += int((~torch.isfinite(ref)).sum())
        kl, top1, lse_r, lse_t = [], [], [], []
        # float64 in chunks of positions: KL of well-aligned targets is ~1e-7, below float32's
        # rounding of the sum; chunks bound the memory of a large vocabulary.
        for start in range(0, ref.shape[0], chunk):
            r = ref[start:start + chunk].double()
            t = tgt[start:start + chunk].double()
            log_r = torch.log_softmax(r, dim=-1)
            log_t = torch.log_softmax(t, dim=-1)
            p_r = log_r.exp()
            # Terms with p_r == 0 contribute 0 even where the target says -inf; NaN stays NaN.
            terms = torch.where(p_r > 0, p_r * (log_r - log_t), torch.zeros_like(p_r))
            terms = torch.where(torch.isnan(log_t), log_t, terms)
            kl.append(terms.sum(-1))
            top1.append((r.argmax(-1) == t.argmax(-1)) & torch.isfinite(t).all(-1))
            nxt = torch.cat([ids[start + 1:start + chunk + 1], ids[-1:]])[:r.shape[0]]
            lse_r.append(-log_r.gather(-1, nxt.unsqueeze(-1)).squeeze(-1))
            lse_t.append(-log_t.gather(-1, nxt.unsqueeze(-1)).squeeze(-1))
        self.kl.append(torch.cat(kl))
        self.top1.append(torch.cat(top1))
        self.buckets.append(bucket_of)
        # The last position has no next token: it is dropped from the perplexity.
        self.nll_ref.append(torch.cat(lse_r)[:-1])
        self.nll_tgt.append(torch.cat(lse_t)[:-1])

    def summary(self, span: int, n_buckets: int) -> tuple[dict, list[BucketRow]]:
        kl = torch.cat(self.kl)
        top1 = torch.cat(self.top1).double()
        buckets = torch.cat(self.buckets)
        rows = []
        for b, (start, end) in enumerate(bucket_bounds(span, n_buckets)):
            mask = buckets == b
            count = int(mask.sum())
            rows.append(BucketRow(bucket=b, start=start, end=end, positions=count,
                                  kl_mean=kl[mask].mean().item() if count else None,
                                  top1_agreement=top1[mask].mean().item() if count else None))
        bucket_kls = [r.kl_mean for r in rows if r.kl_mean is not None]
        ppl_ref = math.exp(torch.cat(self.nll_ref).mean().item())
        ppl_tgt = _exp(torch.cat(self.nll_tgt).mean().item())
        summary = {
            "kl_mean": kl.mean().item(),
            # quantile propagates NaN, which is what gates must see.
            "kl_p99": torch.quantile(kl, 0.99).item(),
            "kl_max": kl.max().item(),
            "kl_max_bucket": _nan_max(bucket_kls),
            "top1_agreement": top1.mean().item(),
            "positions": int(kl.numel()),
            "nonfinite": self.nonfinite,
            "reference_nonfinite": self.reference_nonfinite,
            "perplexity_reference": ppl_ref,
            "perplexity_target": ppl_tgt,
            "perplexity_rel_delta": _rel_delta(ppl_tgt, ppl_ref),
        }
        return summary, rows


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _nan_max(values: list[float]) -> float:
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values) if values else math.nan


def _rel_delta(target: float, reference: float) -> float:
    if math.isnan(target) or math.isnan(reference):
        return math.nan
    if math.isinf(target):
        return math.inf
    return abs(target - reference) / reference if reference else math.nan
