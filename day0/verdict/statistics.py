"""Paired regression tests of a target model against a reference on the same evaluation items.

Design (TensorRT-LLM's accuracy tests, made paired): H0 "no drop", H1 "target worse", one-sided
at ``alpha``; the gate fails when p < alpha. A gate is only meaningful when a true drop of
``allowed_drop`` would be detected with probability ``power``: each result carries the minimum
detectable drop (MDE) at its n and the items needed, so a gate with MDE > allowed_drop can be
reported as a config error ("needs N items") instead of passing vacuously.

Pairing matters: both models answer the same items, so per-item differences cancel the item
difficulty that an unpaired two-sample test would count as noise.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

_EXACT_MAX = 2000  # b + c up to this: exact integer sum; above: log space (no huge ints)
_CHUNK_CELLS = 2_000_000  # bootstrap indices per chunk: ~16 MB int64 plus the gathered floats


class PairedTest(BaseModel):
    """The outcome of one paired test; ``drop`` > 0 means the target is worse."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    test: Literal["mcnemar", "bootstrap"] = Field(description="Exact McNemar (binary) or paired bootstrap (continuous).")
    n: int = Field(description="Number of paired items.")
    reference_score: float = Field(description="Mean of the reference's per-item values.")
    target_score: float = Field(description="Mean of the target's per-item values.")
    drop: float = Field(description="Mean per-item drop of the target (positive = target worse).")
    ci_low: float = Field(description="Lower end of the two-sided (1 - 2*alpha) CI of the drop.")
    ci_high: float = Field(description="Upper end of the two-sided (1 - 2*alpha) CI of the drop.")
    confidence: float = Field(description="Confidence of the CI, 1 - 2*alpha (its sides match the one-sided test).")
    p_value: float = Field(description="One-sided p-value, H1: the target is worse.")
    alpha: float = Field(description="One-sided significance level.")
    power: float = Field(description="Probability of detecting a true drop of allowed_drop.")
    allowed_drop: float = Field(description="The drop the gate must detect.")
    mde: float = Field(description="Minimum detectable drop at this n, alpha and power; inf if none.")
    items_needed: int = Field(description="Items needed for allowed_drop to be detectable at alpha/power.")
    regressed: bool = Field(description="p_value < alpha: the gate fails.")
    b: int | None = Field(None, description="McNemar: items the reference got right and the target wrong.")
    c: int | None = Field(None, description="McNemar: items the target got right and the reference wrong.")
    discordance: float | None = Field(None, description="McNemar: discordance rate used for mde/items_needed.")
    sd: float | None = Field(None, description="Bootstrap: sample sd of the per-item differences.")
    margin: float = Field(0.0, description=(
        "Bootstrap: the drop tolerated as no regression (H0: drop <= margin)."))

    @property
    def underpowered(self) -> bool:
        """MDE > allowed_drop: the gate cannot detect the drop it states (a config error)."""
        return not self.mde <= self.allowed_drop

    def summary(self) -> str:
        """One line for reports and gate reasons."""
        cmp = "<" if self.regressed else ">="
        if self.test == "mcnemar":
            how = f"exact McNemar, b={self.b} c={self.c}, n={self.n}"
        else:
            how = f"paired bootstrap, sd={self.sd:.3g}, n={self.n}" + (
                f", H0 drop <= {self.margin:g}" if self.margin else "")
        line = (f"drop {self.drop:.3g} [{self.ci_low:.3g}, {self.ci_high:.3g}] "
                f"({self.confidence:.0%} CI), p={self.p_value:.2g} {cmp} alpha {self.alpha:g} ({how}); "
                f"MDE {self.mde:.2g} at power {self.power:g}")
        if self.underpowered:
            line += (f"; underpowered: allowed drop {self.allowed_drop:g} needs "
                     f"{self.items_needed} items")
        return line


def _check(alpha: float, power: float, allowed_drop: float | None = None) -> None:
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if not 0.5 <= power < 1:
        raise ValueError(f"power must be in [0.5, 1), got {power!r}")
    if allowed_drop is not None and not allowed_drop > 0:
        raise ValueError(f"allowed_drop must be > 0, got {allowed_drop!r}")


def _check_discordance(discordance: float) -> None:
    if not 0 < discordance <= 1:
        raise ValueError(f"discordance must be in (0, 1], got {discordance!r}")


def _z(alpha: float, power: float) -> tuple[float, float]:
    nd = NormalDist()
    return nd.inv_cdf(1 - alpha), nd.inv_cdf(power)


def _pairs(reference: Sequence, target: Sequence) -> int:
    if len(reference) != len(target):
        raise ValueError(f"reference has {len(reference)} items, target {len(target)}: must be paired")
    if len(reference) < 1:
        raise ValueError("no items to compare")
    return len(reference)


def _connor_n(d: float, alpha: float, power: float, pd: float) -> float:
    """Connor (1987): items for a one-sided McNemar test to detect drop d at discordance pd."""
    za, zb = _z(alpha, power)
    return (za * math.sqrt(pd) + zb * math.sqrt(max(pd - d * d, 0.0))) ** 2 / (d * d)


def mcnemar_items_needed(allowed_drop: float, *, alpha: float, power: float, discordance: float) -> int:
    """Connor's n, rounded up; at least ceil(1/allowed_drop) since a smaller n cannot show the drop."""
    _check(alpha, power, allowed_drop)
    _check_discordance(discordance)
    n = math.ceil(_connor_n(allowed_drop, alpha, power, discordance))
    return max(1, n, math.ceil(1 / allowed_drop - 1e-9))


def mcnemar_mde(n: int, *, alpha: float, power: float, discordance: float) -> float:
    """Smallest drop d with Connor's n(d) <= n (bisection; n(d) falls with d), at least 1/n; inf if none."""
    _check(alpha, power)
    _check_discordance(discordance)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    hi = math.sqrt(discordance)  # no drop can exceed the discordance's square root in Connor's model
    if _connor_n(hi, alpha, power, discordance) > n:
        return math.inf
    lo = 0.0
    for _ in range(200):  # keep f(hi) <= n, so the answer is never below the true root
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if _connor_n(mid, alpha, power, discordance) <= n:
            hi = mid
        else:
            lo = mid
    return max(hi, 1 / n)


def _binary(values: Sequence, side: str) -> list[int]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)):
            out.append(int(v))
        elif isinstance(v, numbers.Real) and not isinstance(v, bool) and v in (0, 1):
            out.append(int(v))
        else:
            raise ValueError(f"{side}[{i}] = {v!r} is not a correctness value (0/1, bool)")
    return out


def _upper_tail_half(b: int, m: int) -> float:
    """P(X >= b), X ~ Binomial(m, 1/2): exact integers for small m, log space (lgamma) above."""
    if b <= 0:
        return 1.0
    if b > m:
        return 0.0
    if m <= _EXACT_MAX:
        return min(1.0, sum(math.comb(m, k) for k in range(b, m + 1)) / 2 ** m)
    lg = math.lgamma(m + 1) - m * math.log(2)
    logs = np.array([lg - math.lgamma(k + 1) - math.lgamma(m - k + 1) for k in range(b, m + 1)])
    top = logs.max()
    return min(1.0, float(math.exp(top) * np.exp(logs - top).sum()))


def mcnemar(reference: Sequence[bool | int | float], target: Sequence[bool | int | float], *,
            allowed_drop: float, alpha: float = 0.05, power: float = 0.8,
            discordance: float = 0.1) -> PairedTest:
    """Exact one-sided McNemar test on per-item correctness, Agresti-Min CI, Connor power.

    Only discordant items carry information; the test conditions on their number b + c.
    ``discordance`` is the gate's assumed disagreement rate; the observed one is used when
    larger (more disagreement needs more items: conservative)."""
    _check(alpha, power, allowed_drop)
    _check_discordance(discordance)
    n = _pairs(reference, target)
    ref, tgt = _binary(reference, "reference"), _binary(target, "target")
    b = sum(1 for r, t in zip(ref, tgt) if r and not t)
    c = sum(1 for r, t in zip(ref, tgt) if t and not r)
    both = sum(1 for r, t in zip(ref, tgt) if r and t)
    p_value = _upper_tail_half(b, b + c)
    # Agresti-Min (2005): add 0.5 to each of the four cells, then the Wald interval
    m = n + 2
    p12, p21 = (b + 0.5) / m, (c + 0.5) / m
    diff = p12 - p21
    half = NormalDist().inv_cdf(1 - alpha) * math.sqrt(max(p12 + p21 - diff * diff, 0.0) / m)
    pd = max(discordance, (b + c) / n)
    return PairedTest(
        test="mcnemar", n=n, reference_score=(both + b) / n, target_score=(both + c) / n,
        drop=(b - c) / n, ci_low=max(-1.0, diff - half), ci_high=min(1.0, diff + half),
        confidence=1 - 2 * alpha, p_value=p_value, alpha=alpha, power=power,
        allowed_drop=allowed_drop, mde=mcnemar_mde(n, alpha=alpha, power=power, discordance=pd),
        items_needed=mcnemar_items_needed(allowed_drop, alpha=alpha, power=power, discordance=pd),
        regressed=p_value < alpha, b=b, c=c, discordance=pd)


def bootstrap_mde(n: int, sd: float, *, alpha: float, power: float) -> float:
    """Normal-approximation MDE of a mean difference: (z_{1-alpha} + z_power) * sd / sqrt(n)."""
    _check(alpha, power)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if not sd >= 0:
        raise ValueError(f"sd must be >= 0, got {sd!r}")
    za, zb = _z(alpha, power)
    return (za + zb) * sd / math.sqrt(n)


def bootstrap_items_needed(allowed_drop: float, sd: float, *, alpha: float, power: float) -> int:
    """Inverse of bootstrap_mde: ceil(((z_{1-alpha} + z_power) * sd / allowed_drop)^2), at least 1."""
    _check(alpha, power, allowed_drop)
    if not sd >= 0:
        raise ValueError(f"sd must be >= 0, got {sd!r}")
    za, zb = _z(alpha, power)
    return max(1, math.ceil(((za + zb) * sd / allowed_drop) ** 2))


def _finite(values: Sequence[float], side: str) -> np.ndarray:
    out = np.empty(len(values), dtype=np.float64)
    for i, v in enumerate(values):
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{side}[{i}] = {v!r} is not a number") from None
        if not math.isfinite(x):
            raise ValueError(f"{side}[{i}] = {v!r} is not finite")
        out[i] = x
    return out


def paired_bootstrap(reference: Sequence[float], target: Sequence[float], *, allowed_drop: float,
                     alpha: float = 0.05, power: float = 0.8, higher_is_better: bool = True,
                     iterations: int = 10000, seed: int = 0, margin: float = 0.0) -> PairedTest:
    """Paired bootstrap of the mean per-item drop for continuous scores.

    Resamples items (not sides), so the pairing is kept; the p-value shifts the bootstrap
    distribution to the null (mean drop = margin: a continuous score moves a little under any
    change of arithmetic, so a drop up to margin is no regression). Seeded: same inputs, same
    result."""
    _check(alpha, power, allowed_drop)
    if not 0 <= margin < allowed_drop:
        raise ValueError(f"margin must be >= 0 and below allowed_drop, got {margin!r}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations!r}")
    n = _pairs(reference, target)
    ref, tgt = _finite(reference, "reference"), _finite(target, "target")
    d = ref - tgt if higher_is_better else tgt - ref
    drop = float(d.mean())
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_CELLS // n)  # memory bounded whatever n
    means = np.empty(iterations, dtype=np.float64)
    for start in range(0, iterations, rows):
        k = min(rows, iterations - start)
        means[start:start + k] = d[rng.integers(0, n, size=(k, n))].mean(axis=1)
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    p_value = (1 + int(np.count_nonzero(means - drop + margin >= drop))) / (iterations + 1)
    sd = float(d.std(ddof=1)) if n > 1 else 0.0
    return PairedTest(
        test="bootstrap", n=n, reference_score=float(ref.mean()), target_score=float(tgt.mean()),
        drop=drop, ci_low=float(lo), ci_high=float(hi), confidence=1 - 2 * alpha, p_value=p_value,
        alpha=alpha, power=power, allowed_drop=allowed_drop,
        mde=margin + bootstrap_mde(n, sd, alpha=alpha, power=power),
        items_needed=bootstrap_items_needed(allowed_drop - margin, sd, alpha=alpha, power=power),
        regressed=p_value < alpha, sd=sd, margin=margin)


__all__ = ["PairedTest", "bootstrap_items_needed", "bootstrap_mde", "mcnemar", "mcnemar_items_needed",
           "mcnemar_mde", "paired_bootstrap"]
