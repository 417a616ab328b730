"""A run against its baseline: bootstrap intervals of latency-quantile ratios, and the gates
that judge them (pattern gates over every workload; not applicable without a baseline)."""

from __future__ import annotations

import random

from day0.verdict.gates import Gate, GatesFile, evaluate, load_gates
from day0.stages import plan
from day0.stages.performance import baseline
from day0.stages.performance.compare import compare, slowdown
from tests.conftest import ROOT


def sample(n, scale, seed):
    rng = random.Random(seed)
    return [scale * rng.lognormvariate(0, 0.3) for _ in range(n)]


def test_the_same_distribution_is_no_slowdown_and_a_doubled_one_is():
    base = sample(24, 100, 1)
    same = slowdown(sample(24, 100, 2), base, q=0.9, confidence=0.9, resamples=2000, seed=0)
    assert same[1] < 1.0 < same[2]  # the interval covers 1
    twice = slowdown(sample(24, 200, 3), base, q=0.9, confidence=0.9, resamples=2000, seed=0)
    assert twice[1] > 1.5, twice


def test_figures_below_the_resolution_are_not_ratios():
    burst = [0.002, 0.003, 0.001, 0.004]  # tokens that arrived in one burst: TPOT ~0
    ratio, low, high = slowdown([0.3, 0.2, 0.4, 0.1], burst, q=0.9, confidence=0.9,
                                resamples=500, seed=0, resolution_ms=1.0)
    assert ratio == low == high == 1.0


def rows(run, scale, seed, n=24):
    return [{"run": run, "ttft_ms": t, "e2el_ms": t + 50 * scale, "output_tokens": 32}
            for t in sample(n, 100 * scale, seed)]


def test_runs_are_compared_only_with_a_baseline_of_the_same_requests():
    runs = [{"run": "a-c1", "workload": "a", "baseline_key": "k1"},
            {"run": "b-c1", "workload": "b", "baseline_key": "k2"},
            {"run": "c-c1", "workload": "c", "baseline_key": "k3"}]
    stored = {"runs": {"a-c1": {"key": "k1", "requests": rows("a-c1", 1, 1)},
                       "b-c1": {"key": "other", "requests": rows("b-c1", 1, 2)}}}
    found, notes = compare(runs, rows("a-c1", 3, 5), stored, q=0.9, confidence=0.9,
                           resamples=500, seed=0)
    assert {(s.run, s.kind) for s in found} == {("a-c1", k) for k in ("ttft", "tpot", "e2el")}
    assert all(s.low > 1.5 for s in found if s.kind != "tpot")
    assert any("b-c1" in n and "other requests" in n for n in notes)
    assert any("c-c1: no baseline" in n for n in notes)


def test_pattern_gates_judge_the_worst_workload_and_name_it():
    gates = GatesFile(gates=[Gate(id="slow", metric="performance.baseline.{workload}.ttft_slowdown",
                                  op="<=", threshold=1.5)])
    [r] = evaluate(gates, {"performance.baseline.short_qa.ttft_slowdown": 2.1,
                           "performance.baseline.agent.ttft_slowdown": 0.9}, is_moe=False)
    assert not r.passed and r.metric == "performance.baseline.short_qa.ttft_slowdown"
    assert "short_qa" in r.reason
    # no baseline for any workload: not applicable (the stage says why), not failed
    [r] = evaluate(gates, {}, is_moe=False,
                   inapplicable={"performance.baseline": "no baseline"})
    assert r.passed and not r.applicable
    # nothing matches and nothing excuses it: fails, once, with the reason
    [r] = evaluate(gates, {}, is_moe=False)
    assert not r.passed and r.not_evaluated


def test_the_shipped_gates_name_performance_metrics_and_it_runs_alone_last():
    ids = {g.id for g in load_gates(ROOT / "gates.yaml").gates
           if g.metric.startswith("performance.")}
    assert {"perf-no-failed-requests", "perf-ttft-vs-baseline", "perf-goodput"} <= ids
    assert ["performance"] in plan(None, "engine")[-2:]  # alone, after the other stages
    # device targets: the kernel profile, alone and last as well
    assert plan(None, "torch")[-1] == ["performance"]


def test_baseline_entries_leave_out_failed_runs_and_keep_other_runs(tmp_path):
    runs = [{"run": "a-c1", "baseline_key": "k1", "failed": 0},
            {"run": "b-c1", "baseline_key": "k2", "failed": 2},
            {"run": "c-c1", "baseline_key": "k3", "error": "timeout"}]
    requests = rows("a-c1", 1, 1) + rows("b-c1", 1, 2)
    entries = baseline.entries(runs, requests)
    assert list(entries) == ["a-c1"] and len(entries["a-c1"]["requests"]) == 24
    where = str(tmp_path) + "/"
    baseline.save(where, entries, promoted_from="run-1")
    baseline.save(where, {"d-c1": {"key": "k4", "requests": []}}, promoted_from="run-2")
    stored = baseline.load(where)
    assert set(stored["runs"]) == {"a-c1", "d-c1"} and stored["promoted"]["from"] == "run-2"
