"""Logit-level comparison: per-position KL(reference || target) and KL(reference || control),
top-1 agreement, perplexity, by position bucket so corruption at far positions is localized."""

from __future__ import annotations

import math

import torch
from pydantic import Field

from day0.execution.contract import Row


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
    positions: int = Field(description="Scored positions in this bucket over all windows.")
    kl_mean: float | None = Field(description="Target: mean KL(ref||target) in this bucket, nats.")
    control_kl_mean: float | None = Field(None, description="Control: mean KL(ref||control).")
    kl_ratio: float | None = Field(None, description="Target / control mean KL (control floored).")
    kl_ratio_low: float | None = Field(None, description="95 % lower bound of that ratio.")
    top1_agreement: float | None = Field(description="Target: fraction with the same argmax.")
    control_top1_agreement: float | None = Field(None, description="Control: the same fraction.")


def _side_terms(log_r: torch.Tensor, p_r: torch.Tensor, x: torch.Tensor, nxt: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL(ref||x) per position, top-1 agreement with the reference, NLL of the next token."""
    log_x = torch.log_softmax(x, dim=-1)
    # Terms with p_r == 0 contribute 0 even where x says -inf; NaN stays NaN.
    terms = torch.where(p_r > 0, p_r * (log_r - log_x), torch.zeros_like(p_r))
    terms = torch.where(torch.isnan(log_x), log_x, terms)
    top1 = (log_r.argmax(-1) == x.argmax(-1)) & torch.isfinite(x).all(-1)
    nll = -log_x.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
    return terms.sum(-1), top1, nll


class LogitAccumulator:
    """Per scored position: KL(ref||target), KL(ref||control), top-1 agreement of each with the
    reference, and the NLL of the next token on all three sides."""

    def __init__(self):
        self.cols: dict[str, list[torch.Tensor]] = {k: [] for k in (
            "kl_t", "kl_c", "top1_t", "top1_c", "nll_r", "nll_t", "nll_c", "has_next")}
        self.nonfinite = 0
        self.reference_nonfinite = 0

    def add(self, ref: torch.Tensor, ctl: torch.Tensor, tgt: torch.Tensor, nxt: torch.Tensor,
            scored: torch.Tensor, has_next: torch.Tensor, chunk: int = 64) -> None:
        """[seq, vocab] logits of one chunk (CPU); nxt: [seq] next token ids (any value where
        has_next is False); scored: [seq] bool, positions that count."""
        self.nonfinite += int((~torch.isfinite(tgt[scored])).sum())
        self.reference_nonfinite += int((~torch.isfinite(ref[scored])).sum())
        out: dict[str, list[torch.Tensor]] = {k: [] for k in self.cols}
        idx = scored.nonzero().flatten()
        # float64 in chunks of positions: KL of well-aligned targets is ~1e-7, below float32's
        # rounding of the sum; chunks bound the memory of a large vocabulary.
        for start in range(0, idx.numel(), chunk):
            sel = idx[start:start + chunk]
            r, c, t = (x[sel].double() for x in (ref, ctl, tgt))
            log_r = torch.log_softmax(r, dim=-1)
            p_r = log_r.exp()
            n = nxt[sel]
            kl_t, top1_t, nll_t = _side_terms(log_r, p_r, t, n)
            kl_c, top1_c, nll_c = _side_terms(log_r, p_r, c, n)
            for key, value in (("kl_t", kl_t), ("kl_c", kl_c), ("top1_t", top1_t),
                               ("top1_c", top1_c), ("nll_t", nll_t), ("nll_c", nll_c),
                               ("nll_r", -log_r.gather(-1, n.unsqueeze(-1)).squeeze(-1)),
                               ("has_next", has_next[sel])):
                out[key].append(value)
        for key, parts in out.items():
            if parts:
                self.cols[key].append(torch.cat(parts))

    def column(self, key: str) -> torch.Tensor:
        return torch.cat(self.cols[key]) if self.cols[key] else torch.zeros(0)

    def summary(self) -> dict:
        kl_t, kl_c = self.column("kl_t"), self.column("kl_c")
        has_next = self.column("has_next").bool()
        nll = {k: self.column(k)[has_next] for k in ("nll_r", "nll_t", "nll_c")}
        ppl_ref = _exp(nll["nll_r"].mean().item())
        ppl_tgt = _exp(nll["nll_t"].mean().item())
        ppl_ctl = _exp(nll["nll_c"].mean().item())
        return {
            "kl_mean": kl_t.mean().item(),
            # quantile propagates NaN, which is what gates must see.
            "kl_p99": torch.quantile(kl_t, 0.99).item(),
            "kl_max": kl_t.max().item(),
            "top1_agreement": self.column("top1_t").double().mean().item(),
            "control_kl_mean": kl_c.mean().item(),
            "control_kl_p99": torch.quantile(kl_c, 0.99).item(),
            "control_kl_max": kl_c.max().item(),
            "control_top1_agreement": self.column("top1_c").double().mean().item(),
            "positions": int(kl_t.numel()),
            "nonfinite": self.nonfinite,
            "reference_nonfinite": self.reference_nonfinite,
            "perplexity_reference": ppl_ref,
            "perplexity_target": ppl_tgt,
            "perplexity_control": ppl_ctl,
            "perplexity_rel_delta": _rel_delta(ppl_tgt, ppl_ref),
            "control_perplexity_rel_delta": _rel_delta(ppl_ctl, ppl_ref),
        }


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
