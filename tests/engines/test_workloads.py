"""Workloads as data and the timed traces they give vLLM's benchmark client."""

from __future__ import annotations

import pytest
import yaml

from day0.engines.loadgen import CHUNK, LoadRun, argv
from day0.engines.settings import Endpoint
from day0.errors import ConfigError
from day0.engines import workloads as wl
from day0.stages.performance.core import selected
from day0.stages.performance.result import Config


def test_bundled_workloads_give_exact_lengths_that_fit_the_context():
    file = wl.load(None)
    assert set(file.workloads) == {"short_qa", "long_document", "agent"}
    for context in (256, 2048, 32768):
        for name, workload in file.workloads.items():
            trace = wl.trace_for(name, workload, context=context, seed=0)
            assert trace
            for e in trace:
                assert e.input_length + e.output_length <= context
                # enough 16-token blocks for exactly input_length tokens
                assert len(e.hash_ids) == -(-e.input_length // CHUNK)


def test_long_documents_come_near_the_context_limit():
    workload = wl.load(None).workloads["long_document"]
    trace = wl.trace_for("long_document", workload, context=4096, seed=0)
    assert all(0.7 * 4096 <= e.input_length <= 0.9 * 4096 for e in trace)


def test_agent_turns_share_the_prefix_and_grow_their_history():
    workload = wl.load(None).workloads["agent"]
    trace = wl.trace_for("agent", workload, context=8192, seed=0)
    prefix = workload.shared_prefix_tokens // CHUNK
    assert len(trace) == workload.requests
    assert len({tuple(e.hash_ids[:prefix]) for e in trace}) == 1  # one shared prefix
    first_turns = trace[: workload.requests // workload.turns]
    second_turns = trace[workload.requests // workload.turns: 2 * workload.requests // workload.turns]
    for earlier, later in zip(first_turns, second_turns):
        full = earlier.input_length // CHUNK
        assert later.hash_ids[:full] == earlier.hash_ids[:full]  # the history is resent
        assert later.input_length > earlier.input_length + earlier.output_length
        assert later.timestamp == earlier.timestamp + workload.think_time_s
    # different conversations part after the shared prefix
    assert first_turns[0].hash_ids[prefix] != first_turns[1].hash_ids[prefix]


def test_a_small_context_caps_the_prefix_and_ends_conversations_with_notes():
    workload = wl.load(None).workloads["agent"]
    notes: list[str] = []
    trace = wl.trace_for("agent", workload, context=256, seed=0, notes=notes)
    assert all(e.input_length + e.output_length <= 256 for e in trace)
    assert any("shared prefix of 64 tokens instead of 512" in n for n in notes)
    assert any("end after" in n for n in notes)


def test_traces_are_the_same_for_a_seed_and_differ_across_seeds():
    workload = wl.load(None).workloads["short_qa"]
    a = wl.trace_for("short_qa", workload, context=2048, seed=0)
    assert a == wl.trace_for("short_qa", workload, context=2048, seed=0)
    assert a != wl.trace_for("short_qa", workload, context=2048, seed=1)


def test_one_run_per_level_and_the_client_arguments():
    workload = wl.load(None).workloads["short_qa"]
    runs = wl.runs_for("short_qa", workload, context=2048, seed=0)
    assert [r.id for r in runs] == ["short_qa-c1", "short_qa-c4"]
    endpoint = Endpoint(base_url="http://127.0.0.1:9", served_name="m", mode="attach")
    args = argv(runs[1], endpoint, "/ckpt", "/t.jsonl", 0)
    assert args[args.index("--max-concurrency") + 1] == "4"
    assert args[args.index("--request-rate") + 1] == "inf"
    assert args[args.index("--dataset-name") + 1] == "timed_trace"
    assert "--no-self-timed" in args and "--save-detailed" in args
    assert args[args.index("--goodput") + 1:args.index("--goodput") + 3] == ["tpot:200", "ttft:2000"]
    poisson = LoadRun(id="x-r2", trace=runs[0].trace, rate=2.0, max_duration_s=10)
    args = argv(poisson, endpoint, "/ckpt", "/t.jsonl", 0)
    assert args[args.index("--request-rate") + 1] == "2.0" and "--max-concurrency" not in args


def test_a_request_that_cannot_fit_is_a_config_error_naming_the_fix():
    workload = wl.Workload(input_tokens={"value": 300}, output_tokens={"value": 10}, requests=2,
                           arrival={"concurrency": [1]})
    with pytest.raises(ConfigError, match="does not fit the engine's context of 256"):
        wl.trace_for("big", workload, context=256, seed=0)


def test_every_problem_of_a_workloads_file_at_once(tmp_path):
    bad = tmp_path / "w.yaml"
    bad.write_text(yaml.safe_dump({"workloads": {
        "a": {"input_tokens": {"dist": "uniform", "min": 4}, "output_tokens": {"value": 4},
              "requests": 4, "arrival": {"concurrency": [1], "rate": [1.0]}},
        "b": {"input_tokens": {"value": 4}, "output_tokens": {"value": 4}, "requests": 0,
              "arrival": {"concurrency": [2]}, "bogus": 1}}}))
    with pytest.raises(ConfigError) as err:
        wl.load(bad)
    text = str(err.value)
    for words in ("needs max", "exactly one of concurrency and rate", "requests", "bogus"):
        assert words in text, text


def test_an_unknown_workload_name_suggests_the_close_one():
    with pytest.raises(ConfigError, match="did you mean 'short_qa'"):
        selected(Config(workloads=["short_q"]), wl.load(None))
