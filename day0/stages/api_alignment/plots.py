"""The api_alignment plot: truncated KL per position bucket, engine vs control."""

from __future__ import annotations

from day0.rendering.plots import bucket_bars


def plots(a: dict) -> dict[str, bytes]:
    return {"kl-buckets": kl_buckets_plot(a)} if a.get("buckets") else {}


def kl_buckets_plot(a: dict) -> bytes:
    return bucket_bars(a["buckets"], "kl_topk_mean", "control_kl_topk_mean", "kl_topk_ratio_low",
                       side_label="engine (API)",
                       ylabel=f"mean truncated KL (top-{a.get('top_k')}), nats",
                       title="KL to the reference over each side's top-k "
                             "(low: 95 % bound of engine/control)")


__all__ = ["plots", "kl_buckets_plot"]
