"""Trends over a soak: the slope of a series against time, robust and with its interval.

Theil-Sen (the median of pairwise slopes; scipy.stats.theilslopes, with its confidence
interval): a few outliers (a garbage collection, a burst of long prompts) move it little,
unlike least squares, and memory that steps up once during warm-up and then stays flat has
slope ~0 once the warm-up is left out. Reported per hour.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Trend(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slope_per_h: float | None = Field(description="Units per hour (Theil-Sen).")
    low_per_h: float | None = Field(description="Lower bound of its interval.")
    high_per_h: float | None = Field(description="Upper bound of its interval.")
    points: int = Field(description="Samples after the warm-up.")
    span_s: float = Field(description="Seconds the samples cover.")

    @classmethod
    def none(cls) -> "Trend":
        return cls(slope_per_h=None, low_per_h=None, high_per_h=None, points=0, span_s=0.0)


def trend(times_s: list[float], values: list[float], *, warmup_s: float,
          confidence: float) -> Trend:
    """The slope of values over times_s (seconds), leaving out t < warmup_s."""
    from scipy.stats import theilslopes

    pairs = [(t, v) for t, v in zip(times_s, values) if t >= warmup_s and v is not None]
    span = pairs[-1][0] - pairs[0][0] if len(pairs) > 1 else 0.0
    if len(pairs) < 4 or span <= 0:
        return Trend(slope_per_h=None, low_per_h=None, high_per_h=None, points=len(pairs),
                     span_s=span)
    t = [p[0] / 3600 for p in pairs]
    y = [p[1] for p in pairs]
    slope, _, low, high = theilslopes(y, t, alpha=confidence)
    return Trend(slope_per_h=float(slope), low_per_h=float(low), high_per_h=float(high),
                 points=len(pairs), span_s=round(span, 3))
