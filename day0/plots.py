"""Shared plotting helpers for the stages' ``plots`` hooks (day0.stages): PNG bytes from
matplotlib figures.

matplotlib is imported only inside these functions (importing day0.report or a stage's hooks
stays cheap) and through the Agg canvas directly, never pyplot: no global backend, no display,
safe in threads. PNGs are small (dpi 90) because the Prefect UI shows them inline as data: URIs.
"""

from __future__ import annotations

import io
import math

DPI = 90


def figure(width: float = 7.5, height: float = 4.2):
    """A matplotlib Figure on the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def number(value) -> float:
    """A float from report.json's values (NaN/Infinity may be strings there); None -> NaN."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def positive(values: list[float]) -> bool:
    """Whether a log scale can show these values (all finite ones above zero, at least one)."""
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and min(finite) > 0


__all__ = ["figure", "png", "number", "positive", "DPI"]
