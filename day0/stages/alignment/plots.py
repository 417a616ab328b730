"""The alignment stage's plots (its ``plots`` hook): PNG bytes from its result as report.json
keeps it (day0.rendering.plots draws; matplotlib is imported only when a plot is made)."""

from __future__ import annotations

import math

from day0.rendering.plots import bucket_bars, figure, number, png, positive

TARGET, CONTROL, BOUND, BAD = "#d62728", "#1f77b4", "#555555", "#d62728"


def plots(a: dict) -> dict[str, bytes]:
    """``layers``: per-layer error of target and control, and the target/control ratio against
    its bound, the first divergent layer marked; ``kl-buckets``: mean KL per position bucket,
    target vs control."""
    out = {}
    if a.get("layers"):
        out["layers"] = layers_plot(a)
    if a.get("buckets"):
        out["kl-buckets"] = kl_buckets_plot(a)
    return out


def layers_plot(a: dict) -> bytes:
    rows = a["layers"]
    x = [int(r.get("layer", i)) for i, r in enumerate(rows)]
    target = [number(r.get("rel_error")) for r in rows]
    control = [number(r.get("control_rel_error")) for r in rows]
    ratio = [number(r.get("ratio")) for r in rows]
    low = [number(r.get("ratio_low")) for r in rows]
    bound = [number(r.get("bound")) for r in rows]
    diverged = [bool(r.get("diverged")) for r in rows]
    first = a.get("first_divergent_layer")

    fig = figure(7.5, 5.6)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(x, target, "o-", color=TARGET, label="target")
    top.plot(x, control, "s--", color=CONTROL, label="control (known-good port)")
    for i, bad in zip(x, diverged):
        if bad and not math.isfinite(target[x.index(i)]):
            top.annotate("non-finite", (i, 0.5), xycoords=("data", "axes fraction"),
                         color=BAD, ha="center", rotation=90)
    if positive(target + control):
        top.set_yscale("log")
    top.set_ylabel("||x - ref|| / ||ref||")
    top.set_title("Per-layer relative error against the float32 reference")
    top.legend(loc="best", fontsize=8)

    bottom.plot(x, ratio, "o", color="#444444", label="target / control")
    bottom.plot(x, low, "v", color=TARGET, label="95 % lower bound (worst bucket)")
    bottom.step(x, bound, where="mid", color=BOUND, linestyle=":",
                label="bound: a layer diverges above it")
    marked = [(i, v if math.isfinite(v) else b) for i, v, b, bad in zip(x, low, bound, diverged)
              if bad]
    if marked:
        bottom.scatter(*zip(*marked), s=140, facecolors="none", edgecolors=BAD, linewidths=2,
                       label="diverged", zorder=3)
    if positive(ratio + low + bound):
        bottom.set_yscale("log")
    bottom.set_ylabel("error ratio")
    bottom.set_xlabel("decoder layer")
    bottom.legend(loc="best", fontsize=8)
    if first is not None:
        for ax in (top, bottom):
            ax.axvline(int(first), color=BAD, linestyle="--", linewidth=1)
        top.annotate(f"first divergent layer: {first}", (int(first), 0.5),
                     xycoords=("data", "axes fraction"), xytext=(6, 0),
                     textcoords="offset points", color=BAD, fontsize=9,
                     bbox={"facecolor": "white", "edgecolor": BAD, "alpha": 0.9})
    else:
        bottom.annotate("no layer diverged", (0.5, 0.5), xycoords="axes fraction",
                        ha="center", color="#2ca02c", fontsize=10)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.set_xticks(x if len(x) <= 40 else x[::max(1, len(x) // 20)])
    return png(fig)


def kl_buckets_plot(a: dict) -> bytes:
    return bucket_bars(a["buckets"], "kl_mean", "control_kl_mean", "kl_ratio_low",
                       side_label="target", ylabel="mean KL(ref || x), nats",
                       title="KL to the reference per position bucket "
                             "(low: 95 % lower bound of target/control)")


__all__ = ["plots", "layers_plot", "kl_buckets_plot"]
