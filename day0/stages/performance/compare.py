"""A run against its baseline: the slowdown of a latency percentile, with its noise.

For each of TTFT, TPOT and E2EL the ratio q(run) / q(baseline) of the ``quantile`` over the
requests, and a bootstrap confidence interval of that ratio (each side's requests resampled
with replacement, ``resamples`` times, seeded). Figures below ``resolution_ms`` count as
that much: a tiny model's tokens can arrive in one burst (TPOT ~0), and a ratio of two such
figures is noise, not a slowdown. The gated figure is the interval's lower bound:
a run is "slower by at least that factor" with the interval's confidence, so the requests'
own scatter and a handful of slow outliers do not trip a gate, while a real slowdown does.
"""

from __future__ import annotations

import random

from day0.execution.contract import Row
from pydantic import Field

KINDS = ("ttft", "tpot", "e2el")


class Slowdown(Row):
    run: str
    workload: str
    kind: str = Field(description="ttft, tpot or e2el.")
    quantile: float
    baseline_ms: float | None
    current_ms: float | None
    ratio: float | None = Field(description="current / baseline.")
    low: float | None = Field(description="Lower bound of the ratio's interval.")
    high: float | None = Field(description="Upper bound of the ratio's interval.")
    baseline_requests: int
    current_requests: int


def per_request(requests: list[dict], kind: str) -> list[float]:
    values = []
    for r in requests:
        ttft, e2el, out = r.get("ttft_ms"), r.get("e2el_ms"), r.get("output_tokens")
        if kind == "ttft" and ttft is not None:
            values.append(ttft)
        elif kind == "e2el" and e2el is not None:
            values.append(e2el)
        elif kind == "tpot" and None not in (ttft, e2el, out) and out > 1:
            values.append((e2el - ttft) / (out - 1))
    return values


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def slowdown(current: list[float], baseline: list[float], *, q: float, confidence: float,
             resamples: int, seed: int, resolution_ms: float = 1.0
             ) -> tuple[float | None, float | None, float | None]:
    """(ratio, low, high) of q-quantiles, current over baseline; Nones without data."""
    if len(current) < 2 or len(baseline) < 2:
        return None, None, None
    floor = resolution_ms  # below it a figure is streaming granularity, not a latency
    ratio = max(quantile(current, q), floor) / max(quantile(baseline, q), floor)
    rng = random.Random(seed)
    draws = sorted(
        max(quantile(rng.choices(current, k=len(current)), q), floor)
        / max(quantile(rng.choices(baseline, k=len(baseline)), q), floor)
        for _ in range(resamples))
    tail = (1 - confidence) / 2
    return ratio, quantile(draws, tail), quantile(draws, 1 - tail)


def compare(runs: list[dict], requests: list[dict], stored: dict, *, q: float,
            confidence: float, resamples: int, seed: int, resolution_ms: float = 1.0,
            min_requests: int = 2) -> tuple[list[Slowdown], list[str]]:
    """Slowdowns of every run that has a baseline of the same requests; notes for the rest."""
    rows, notes = [], []
    for run in runs:
        entry = (stored.get("runs") or {}).get(run["run"])
        if run.get("error"):
            continue
        if entry is None:
            notes.append(f"{run['run']}: no baseline for this run")
            continue
        if entry.get("key") != run.get("baseline_key"):
            notes.append(f"{run['run']}: the baseline was measured with other requests "
                         "(workload, seed or context changed): not compared; promote a new one")
            continue
        mine = [r for r in requests if r["run"] == run["run"] and not r.get("error")]
        if min(len(mine), len(entry["requests"])) < min_requests:
            notes.append(f"{run['run']}: {len(mine)} requests against {len(entry['requests'])} "
                         f"in the baseline, fewer than min_requests ({min_requests}): not "
                         "compared")
            continue
        for kind in KINDS:
            cur, base = per_request(mine, kind), per_request(entry["requests"], kind)
            ratio, low, high = slowdown(cur, base, q=q, confidence=confidence,
                                        resamples=resamples, seed=seed,
                                        resolution_ms=resolution_ms)
            rows.append(Slowdown(
                run=run["run"], workload=run["workload"], kind=kind, quantile=q,
                baseline_ms=quantile(base, q) if base else None,
                current_ms=quantile(cur, q) if cur else None, ratio=ratio, low=low, high=high,
                baseline_requests=len(base), current_requests=len(cur)))
    return rows, notes
