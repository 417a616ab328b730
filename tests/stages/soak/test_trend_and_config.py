"""The soak's pieces that need no engine: durations, trends with their intervals, the per-request
view of a memory slope, probe comparison, planning and the time budget."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from day0.execution.budget import derive
from day0.durations import seconds
from day0.stages import plan
from day0.stages.soak.checks import compare_probes
from day0.stages.soak.result import Config, Result, Window
from day0.stages.soak.trend import trend
from day0.execution.targets import resolve_target


@pytest.mark.parametrize("text,expected", [("10h", 36000), ("30m", 1800), ("1h30m", 5400),
                                           ("90s", 90), ("45", 45), (12.5, 12.5)])
def test_durations_as_people_write_them(text, expected):
    assert seconds(text) == expected


@pytest.mark.parametrize("bad", ["10x", "h", "", "-5m", "0s"])
def test_a_bad_duration_is_refused_with_an_example(bad):
    with pytest.raises(ValidationError, match="duration"):
        Config(duration=bad)


def test_ten_hours_are_accepted_and_extend_the_stage_time_budget():
    config = Config(duration="10h")
    assert config.duration_s == 36000
    target = resolve_target("vllm-cpu-bf16")
    budget = derive("soak", target, None, stage_config={"duration": "10h"})
    assert budget.timeout_s >= 36000 + 600 and "36000" in budget.timeout_basis
    assert derive("soak", target, None).timeout_s < 3600


def test_a_leak_has_a_slope_whose_interval_excludes_zero_and_scatter_does_not():
    rng = random.Random(0)
    t = [i * 2.0 for i in range(120)]
    flat = trend(t, [3000 + rng.gauss(0, 3) for _ in t], warmup_s=30, confidence=0.9)
    assert flat.low_per_h < 0 < flat.high_per_h
    leak = trend(t, [3000 + 0.5 * x + rng.gauss(0, 3) for x in t], warmup_s=30, confidence=0.9)
    assert 1500 < leak.low_per_h <= leak.slope_per_h <= leak.high_per_h  # 1800 MiB/h
    # a step during warm-up, flat afterwards: no slope once the warm-up is left out
    step = trend(t, [3000 + (50 if x > 20 else 0) + rng.gauss(0, 3) for x in t], warmup_s=30,
                 confidence=0.9)
    assert step.low_per_h < 0 < step.high_per_h
    assert trend(t[:3], [1, 2, 3], warmup_s=0, confidence=0.9).slope_per_h is None


def window(i, requests=100, failed=0):
    return Window(window=f"soak-w{i:04d}", start_s=i * 10.0, end_s=i * 10.0 + 10, requests=requests,
                  failed=failed, empty=0)


def test_a_memory_slope_as_kib_per_request_and_the_metrics():
    result = Result(endpoint="x", load_generator="g", workload="short_qa", concurrency=4,
                    planned_s=60, elapsed_s=60, windows=[window(i) for i in range(6)],
                    memory_source="m", healthy_after=True)
    # 600 requests in 60 s = 36000/h; 3600 MiB/h is 0.1 MiB = 102.4 KiB per request
    assert result.per_request(3600) == pytest.approx(102.4)
    metrics = result.metrics()
    assert metrics["soak.interrupted"] == 0 and metrics["soak.windows"] == 6
    assert metrics["soak.hourly.rss_slope_low_mb_per_h"] is None  # no samples
    interrupted = result.model_copy(update={"interrupted": "SIGTERM after 20 s of 60 s"})
    assert interrupted.metrics()["soak.interrupted"] == 1


def test_probes_that_changed_or_failed_count():
    rows = compare_probes(["a", "b", None], ["a", "c", None])
    assert [r.changed for r in rows] == [False, True, True]


def test_the_soak_runs_alone_after_every_other_engine_stage():
    waves = plan(None, "engine")
    assert waves[-2:] == [["performance"], ["soak"]] or waves[-2:] == [["soak"], ["performance"]]
    assert all(len(w) == 1 for w in waves[-2:])
