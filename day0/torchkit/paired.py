"""Target vs control, paired: is the target's error against the reference significantly larger
than the control's (the reference implementation at the target's dtype on the reference device)?

Both sides see the same tokens, so the comparison is paired: per scored position there is a
target value and a control value (KL to the reference, squared hidden-state error, top-1
disagreement, NLL). Neighbouring positions are correlated, so confidence intervals come from a
block bootstrap: positions are cut into blocks of consecutive positions (never across a window
or position-bucket boundary), blocks are drawn with replacement, and the statistic is
recomputed per draw. The draw uses a fixed seed, so a verdict is reproducible.

A ratio ``target / max(control, floor)`` says how many times worse than a known-good port the
target is; the floor keeps a control that is exactly right (a float32 target: control ==
reference) from turning noise into an infinite ratio. Gates read the one-sided lower confidence
bound: a FAIL means "worse than the bound with 95 % confidence", so a correct stack whose error
is merely similar to the control's is not flagged by chance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from pydantic import Field

from day0.execution.contract import Row

DRAWS = 2000
CONFIDENCE = 0.95
SEED = 20261130


@dataclass
class Blocks:
    """Block structure of the scored positions: block id per position, bucket per block."""

    block_of: torch.Tensor      # [n] block index of each scored position
    bucket_of_block: torch.Tensor  # [n_blocks] position bucket of each block
    n_blocks: int

    @classmethod
    def build(cls, window_of: torch.Tensor, bucket_of: torch.Tensor, block_size: int) -> "Blocks":
        """Consecutive positions of one window and one bucket form blocks of block_size."""
        n = int(window_of.numel())
        block_of = torch.empty(n, dtype=torch.long)
        buckets: list[int] = []
        current, filled, key = -1, 0, None
        for i in range(n):
            this = (int(window_of[i]), int(bucket_of[i]))
            if this != key or filled == block_size:
                current, filled, key = current + 1, 0, this
                buckets.append(this[1])
            block_of[i] = current
            filled += 1
        return cls(block_of, torch.tensor(buckets, dtype=torch.long), current + 1)

    def sums(self, values: torch.Tensor) -> torch.Tensor:
        """[n, ...] per-position values -> [n_blocks, ...] block sums (float64)."""
        out = torch.zeros((self.n_blocks, *values.shape[1:]), dtype=torch.float64)
        return out.index_add(0, self.block_of, values.double())

    def draws(self, subset: torch.Tensor | None = None) -> torch.Tensor:
        """[DRAWS, n_blocks] multiplicity of each block per bootstrap draw (subset: block mask)."""
        pool = torch.arange(self.n_blocks) if subset is None else subset.nonzero().flatten()
        gen = torch.Generator().manual_seed(SEED)
        picks = pool[torch.randint(len(pool), (DRAWS, len(pool)), generator=gen)]
        counts = torch.zeros(DRAWS, self.n_blocks, dtype=torch.float64)
        return counts.scatter_add_(1, picks, torch.ones_like(picks, dtype=torch.float64))


class Comparison(Row):
    """One statistic of the target next to the control's, with the paired ratio."""

    metric: str = Field(description="What is compared (see the report's definitions).")
    target: float = Field(description="The target's value against the reference.")
    control: float = Field(description="The control's value against the reference.")
    ratio: float = Field(description="target / max(control, floor): 1 = as good as the control.")
    low: float = Field(description="One-sided 95 % lower confidence bound of the ratio "
                                   "(block bootstrap over positions); gates read this.")
    high: float = Field(description="Upper 95 % confidence bound of the ratio.")
    floor: float = Field(description="Control values below this count as this (noise level).")
    positions: int = Field(description="Scored positions the statistic is over.")


def _quantiles(samples: torch.Tensor) -> tuple[float, float]:
    finite = samples[torch.isfinite(samples)]
    if finite.numel() < samples.numel():  # a non-finite draw: the bound is not finite either
        return math.inf, math.inf
    alpha = 1.0 - CONFIDENCE
    return (torch.quantile(samples, alpha).item(), torch.quantile(samples, 1 - alpha).item())


def ratios(metrics: list[str], target: torch.Tensor, control: torch.Tensor, blocks: Blocks,
           floor: float, subset: torch.Tensor | None = None) -> list[Comparison]:
    """Per column k: mean(target[:, k]) / max(mean(control[:, k]), floor) over the positions of
    the blocks in subset (a block mask; None = all), with its bootstrap interval.
    target/control: [n] or [n, k]."""
    if target.dim() == 1:
        target, control = target[:, None], control[:, None]
    a, b = blocks.sums(target), blocks.sums(control)
    n = blocks.sums(torch.ones(target.shape[0]))
    mask = torch.ones(blocks.n_blocks, dtype=torch.bool) if subset is None else subset
    if not bool(mask.any()):
        return [Comparison(metric=m, target=math.nan, control=math.nan, ratio=math.nan,
                           low=math.nan, high=math.nan, floor=floor, positions=0)
                for m in metrics]
    counts = blocks.draws(mask)

    def ratio(sa, sb, sn):
        return (sa / sn) / torch.clamp(sb / sn, min=floor)

    n_d = (counts @ n)[:, None]
    draws = ratio(counts @ a, counts @ b, n_d)                 # [DRAWS, k]
    pa, pb, pn = a[mask].sum(0), b[mask].sum(0), n[mask].sum()
    point = ratio(pa, pb, pn)
    mean_t, mean_c = pa / pn, pb / pn
    out = []
    for k, metric in enumerate(metrics):
        low, high = _quantiles(draws[:, k])
        out.append(Comparison(metric=metric, target=float(mean_t[k]), control=float(mean_c[k]),
                              ratio=float(point[k]), low=low, high=high, floor=floor,
                              positions=int(pn)))
    return out


def mean_excess(metric: str, target: torch.Tensor, control: torch.Tensor, blocks: Blocks
                ) -> Comparison:
    """Perplexity of the target relative to the control's on the same tokens:
    exp(mean(nll_target - nll_control)); 1 = equal, 1.01 = 1 % worse. Stored as a ratio."""
    diff = blocks.sums(target - control)
    n = blocks.sums(torch.ones_like(target))
    counts = blocks.draws()
    low, high = _quantiles(torch.exp((counts @ diff) / (counts @ n)))
    point = math.exp(float(diff.sum() / n.sum())) if torch.isfinite(diff.sum()) else math.nan
    return Comparison(metric=metric, target=math.exp(float(target.double().mean())),
                      control=math.exp(float(control.double().mean())), ratio=point,
                      low=low if math.isfinite(point) else math.nan,
                      high=high if math.isfinite(point) else math.nan, floor=0.0,
                      positions=int(n.sum()))


def worst(rows: list[Comparison]) -> Comparison | None:
    """The comparison with the largest lower bound (NaN first: it is the worst finding)."""
    if not rows:
        return None
    return max(rows, key=lambda r: math.inf if math.isnan(r.low) else r.low)


__all__ = ["Blocks", "Comparison", "ratios", "mean_excess", "worst"]
