"""Shared plotting helpers for the stages' ``plots`` hooks (day0.stages): PNG bytes from
matplotlib figures.

matplotlib is imported only inside these functions (importing day0.verdict.report or a stage's hooks
stays cheap) and through the Agg canvas directly, never pyplot: no global backend, no display,
safe in threads. PNGs are small (dpi 90) because the Prefect UI shows them inline as data: URIs.
"""

from __future__ import annotations

import io
import math
import threading

DPI = 90


def figure(width: float = 7.5, height: float = 4.2):
    """A matplotlib Figure on the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def warm_up() -> None:
    """Import matplotlib and draw a blank figure in a background thread. The flow's process
    only waits while its stages run in their own processes; the report's plots, drawn after the
    last stage, then skip that first cost (about 0.5 s of a validation on a 2-core machine)."""
    threading.Thread(target=_draw_blank, name="day0-plots-warm-up", daemon=True).start()


def _draw_blank() -> None:
    try:
        png(figure(1, 1))
    except Exception:  # noqa: BLE001 - the report's own plots name what is wrong
        pass


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


SIDE, CONTROL, BAD = "#d62728", "#1f77b4", "#d62728"


def bucket_bars(buckets: list[dict], side_key: str, control_key: str, low_key: str, *,
                side_label: str, ylabel: str, title: str) -> bytes:
    """Mean KL per position bucket, the side under test next to the control, each bucket
    annotated with the lower bound of their ratio (or 'non-finite'); log scale when it can."""
    labels = [f"{b.get('start')}-{(b.get('end') or 1) - 1}" for b in buckets]
    side = [number(b.get(side_key)) for b in buckets]
    control = [number(b.get(control_key)) for b in buckets]
    lows = [number(b.get(low_key)) for b in buckets]
    x = list(range(len(buckets)))
    fig = figure(7.5, 4.0)
    ax = fig.subplots()
    width = 0.38
    ax.bar([i - width / 2 for i in x], [v if math.isfinite(v) else 0 for v in side], width,
           color=SIDE, label=side_label)
    ax.bar([i + width / 2 for i in x], [v if math.isfinite(v) else 0 for v in control], width,
           color=CONTROL, label="control (known-good port)")
    if positive(side + control):
        ax.set_yscale("log")
    for i, (value, low) in enumerate(zip(side, lows)):
        text = "non-finite" if not math.isfinite(value) else (
            f"low {low:.3g}" if math.isfinite(low) else "")
        if text:
            ax.annotate(text, (i, 1.0), xycoords=("data", "axes fraction"), xytext=(0, -12),
                        textcoords="offset points", ha="center", fontsize=8,
                        color=BAD if not math.isfinite(value) else "#333333")
    ax.set_xticks(x, labels)
    ax.set_xlabel("position bucket (positions within a window)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return png(fig)


__all__ = ["figure", "png", "number", "positive", "bucket_bars", "DPI"]
