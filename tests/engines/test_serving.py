"""The serving stage: comparison logic (pure), and against a real vLLM for CPU (engine, slow).

The engine tests attach to the session's plain configuration (tiny_llama_engine) and launch
variants themselves (~75 s each on the 2-core CI machine): the built-in target's two variants
must agree and hit the cache; a variant that really changes the numbers (fp8 KV cache) and
claims prefix caching with caching off must fail both ways, in one launch.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml

from day0 import stages
from day0.execution.contract import StageInputs
from day0.engines.client import EngineProtocolError, EngineStartError
from day0.errors import ConfigError
from day0.stages.serving import core as serving
from day0.stages.serving import runs as gen
from day0.stages.serving import variants as var
from day0.stages.serving.compare import agreement, worst
from day0.stages.serving.prompts import common_prefix, cut_prompts, plan_lengths
from tests.engines.conftest import TINY_LLAMA, engine_target

TOL = 0.1


def steps(tokens, logprob=-1.0, others=((7, -3.0), (8, -4.0))):
    """A greedy run: each token chosen with `logprob`, plus a fixed top-k of other tokens."""
    return [(t, {t: logprob, **{o: lp for o, lp in others if o != t}}) for t in tokens]


# ------------------------------------------------------------------------------ comparison

def test_identical_runs_agree_exactly():
    run = [steps([1, 2, 3]), steps([4, 5, 6])]
    result = agreement("x", run, run, TOL)
    assert result.passed and result.max_logprob_diff == 0.0 and result.tokens_compared == 6
    assert result.not_close == result.diverged == 0 and result.problems(TOL) == []


def test_logprob_shift_over_tolerance_fails_under_passes():
    base = [steps([1, 2, 3], -1.0)]
    near = agreement("near", base, [steps([1, 2, 3], -1.05)], TOL)
    far = agreement("far", base, [steps([1, 2, 3], -1.3)], TOL)
    assert near.passed and near.max_logprob_diff == pytest.approx(0.05)
    assert not far.passed and far.over_tolerance and far.not_close == 0
    assert far.max_logprob_diff == pytest.approx(0.3)
    assert "max |Δlogprob| 0.3 > tolerance 0.1" in far.problems(TOL)[0]


def test_near_tie_diverges_but_is_close_and_later_tokens_are_not_compared():
    base = [steps([1, 2, 3])]
    # position 1: 7 instead of 2, and 7 is in the baseline's top-k, 2 in the other's
    other = [[(1, {1: -1.0}), (7, {7: -0.69, 2: -0.70}), (9, {9: -9.0})]]
    result = agreement("tie", base, other, TOL)
    assert result.passed and result.diverged == 1 and result.rows[0].first_difference == 1
    assert result.tokens_compared == 1  # the -9.0 after the difference is never compared


def test_token_outside_top_k_is_not_close():
    base = [steps([1, 2, 3])]
    other = [[(1, {1: -1.0}), (42, {42: -0.1, 43: -2.0}), (3, {3: -1.0})]]
    result = agreement("flip", base, other, TOL)
    assert not result.passed and result.not_close == 1
    assert "not close" in result.problems(TOL)[0] and "position 1: 2 vs 42" in result.problems(TOL)[0]


def test_nan_logprob_never_passes_a_tolerance():
    result = agreement("nan", [steps([1, 2])], [steps([1, 2], math.nan)], TOL)
    assert math.isnan(result.max_logprob_diff) and result.over_tolerance and not result.passed
    assert math.isnan(worst([0.5, math.nan, 0.1])) and worst([]) == 0.0 and worst([0.1, 0.3]) == 0.3


# --------------------------------------------------------------------------- API answers

def answer(tokens, chosen, tops):
    return {"choices": [{"logprobs": {"tokens": tokens, "token_logprobs": chosen,
                                      "top_logprobs": tops}, "finish_reason": "length"}]}


def test_steps_by_token_id_with_the_chosen_token_in_its_top():
    parsed = gen.steps_of(answer(["token_id:5", "token_id:6"], [-0.5, -2.5],
                                 [{"token_id:5": -0.5, "token_id:9": -1.0},
                                  {"token_id:3": -0.2, "token_id:4": -0.3}]), expected=2)
    assert parsed == [(5, {5: -0.5, 9: -1.0}), (6, {3: -0.2, 4: -0.3, 6: -2.5})]
    # an engine that names tokens by text is compared by text
    assert gen.steps_of(answer(["a"], [-1.0], [{"a": -1.0}])) == [("a", {"a": -1.0})]


def test_steps_refuse_a_short_or_malformed_answer():
    with pytest.raises(EngineProtocolError, match="2 tokens generated, 3 asked"):
        gen.steps_of(answer(["token_id:1", "token_id:2"], [-1.0, -1.0], [{}, {}]), expected=3)
    with pytest.raises(EngineProtocolError, match="no logprobs"):
        gen.steps_of({"choices": [{"text": "hi", "logprobs": None}]})


def test_request_body_is_greedy_by_token_ids():
    body = gen.body("m", [0, 5, 6], 16, 5)
    assert body["prompt"] == [0, 5, 6] and body["temperature"] == 0.0 and body["logprobs"] == 5
    assert body["max_tokens"] == 16 and body["ignore_eos"] and body["return_tokens_as_token_ids"]


def test_max_in_flight():
    assert gen.max_in_flight([(0, 1), (1, 2), (2, 3)]) == 1  # back to back: never two at once
    assert gen.max_in_flight([(0, 5), (1, 2), (1.5, 6), (7, 8)]) == 3


def prometheus(hits: float) -> str:
    return ("# TYPE vllm:prefix_cache_hits_total counter\n"
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}\n'
            f'vllm:prefix_cache_hits_created{{engine="0",model_name="m"}} 1.7e9\n')


def test_prefix_cache_counter_from_prometheus_text():
    assert gen.counter_value(prometheus(512.0), "vllm:prefix_cache_hits") == 512.0
    assert gen.counter_value(prometheus(512.0), "sglang:cache_hits") is None
    assert gen.counter_value(None, "vllm:prefix_cache_hits") is None  # no /metrics


def test_variant_features_from_name_and_args():
    assert var.token_budget(["--enable-chunked-prefill", "--max-num-batched-tokens", "64"]) == 64
    assert var.token_budget(["--max-num-batched-tokens=32"]) == 32
    assert var.token_budget(["--enable-prefix-caching"]) is None
    assert var.features("prefix-caching", []) == ["prefix-caching"]
    assert var.features("x", ["--enable-prefix-caching", "--max-num-batched-tokens", "8"]) == [
        "prefix-caching", "token-budget"]
    assert var.features("chunked", []) == ["token-budget"] and var.features("fp8-kv", []) == []


class FakeEngine:
    """A client with canned answers: every pass of the prompt set returns `run`; /metrics
    reports `hits_per_pass` more prefix-cache hits after each pass."""

    def __init__(self, run, hits_per_pass=0.0, metrics=True):
        self.run, self.hits_per_pass, self.metrics, self.calls = run, hits_per_pass, metrics, 0

    def completion(self, body):
        steps_ = self.run[self.calls % len(self.run)]
        self.calls += 1
        return answer([f"token_id:{t}" for t, _ in steps_], [top[t] for t, top in steps_],
                      [{f"token_id:{k}": v for k, v in top.items()} for _, top in steps_])

    def send(self, method, path, body=None):
        if not self.metrics:
            return 404, "not found"
        return 200, prometheus(self.hits_per_pass * (self.calls // len(self.run)))


def judge(name, args, engine, baseline, prompts):
    return var.check(name, args, engine, "m", prompts, baseline, new_tokens=3, top_k=3,
                     tolerance=TOL, cache_metric="vllm:prefix_cache_hits", log=lambda _: None)


BASE = [steps([1, 2, 3]), steps([4, 5, 6])]
LONG = [[0] * 100, [0] * 80]


def test_prefix_variant_that_never_hits_is_vacuous(monkeypatch):
    monkeypatch.setattr(gen.time, "sleep", lambda _: None)
    cold = judge("prefix-caching", [], FakeEngine(BASE, 0.0), BASE, LONG)
    assert not cold.passed and cold.vacuous and cold.prefix_cache_hits == 0
    assert len(cold.passes) == 2 and cold.not_close == 0 and cold.max_logprob_diff == 0
    assert len(cold.reasons) == 1 and "never hit" in cold.reasons[0]
    warm = judge("x", ["--enable-prefix-caching"], FakeEngine(BASE, 128.0), BASE, LONG)
    assert warm.passed and warm.prefix_cache_hits == 256, warm.reasons
    assert warm.prefix_cache_hits_second_pass == 128
    blind = judge("prefix-caching", [], FakeEngine(BASE, metrics=False), BASE, LONG)
    assert blind.vacuous and "does not export vllm:prefix_cache_hits" in blind.reasons[0]
    plain = judge("fp8-kv", [], FakeEngine(BASE), BASE, LONG)
    assert plain.passed and plain.prefix_cache_hits is None and len(plain.passes) == 1


def test_budget_variant_must_have_prompts_longer_than_its_budget():
    args = ["--enable-chunked-prefill", "--max-num-batched-tokens", "64"]
    ok = judge("chunked", args, FakeEngine(BASE), BASE, LONG)
    assert ok.passed and ok.prompts_over_budget == 2 and ok.token_budget == 64, ok.reasons
    unsplit = judge("chunked", args, FakeEngine(BASE), BASE, [[0] * 50, [0] * 64])
    assert unsplit.vacuous and unsplit.prompts_over_budget == 0
    assert "no prompt is longer than its budget of 64" in unsplit.reasons[0]
    nobudget = judge("chunked-prefill", [], FakeEngine(BASE), BASE, LONG)
    assert nobudget.vacuous and "sets no --max-num-batched-tokens" in nobudget.reasons[0]


def test_variant_with_other_numbers_fails_with_its_reasons():
    shifted = [steps([1, 2, 3], -1.5), steps([4, 5, 6], -1.5)]
    row = judge("fp8-kv", [], FakeEngine(shifted), BASE, LONG)
    assert not row.passed and not row.vacuous and row.max_logprob_diff == pytest.approx(0.5)
    assert row.reasons == ["fp8-kv: max |Δlogprob| 0.5 > tolerance 0.1"]


# ------------------------------------------------------------------------------- prompts

def test_prompt_lengths_fit_the_context_and_share_a_prefix():
    lengths, prefix = plan_lengths(8, 144, 240, 136, context=256, new_tokens=16)
    assert lengths[0] == 144 and lengths[-1] == 240 and prefix == 136
    assert lengths == sorted(set(lengths)) and all(n + 16 <= 256 for n in lengths)
    small, small_prefix = plan_lengths(4, 144, 240, 136, context=128, new_tokens=16)
    assert max(small) == 112 and small_prefix == 111
    with pytest.raises(ConfigError, match="no room"):
        plan_lengths(2, 10, 20, 5, context=32, new_tokens=31)


def test_prompts_cut_from_the_text():
    text = list(range(10, 2010))
    prompts, pads = cut_prompts(text, [150, 200], 136, start=0, padding=3)
    assert [len(p.ids) for p in prompts] == [150, 200] and len(pads) == 3
    assert common_prefix([p.ids for p in prompts]) == 136
    assert prompts[0].ids[:3] == [0, 10, 11] and all(p.ids[0] == 0 for p in pads)
    continuations = [tuple(p.ids[136:]) for p in prompts] + [tuple(p.ids[1:]) for p in pads]
    assert len(set(continuations)) == 5  # each its own stretch of text
    with pytest.raises(ConfigError, match="evaluation text has 100 tokens"):
        cut_prompts(list(range(100)), [150], 136, start=0)


# ------------------------------------------------------------------------------ contract

def test_config_is_strict_and_documented():
    for name, field in serving.Config.model_fields.items():
        assert field.description, name
    with pytest.raises(Exception, match="extra"):
        serving.Config(prompt_count=3)
    assert serving.Config().concurrency == 16
    assert stages.get("serving").target_kinds == ("engine",) and stages.get("serving").uses_endpoint
    assert stages.get("serving").after == ("analysis",)


def test_unknown_variant_is_a_config_error():
    with pytest.raises(ConfigError, match="nope"):
        serving._selected(serving.Config(variants=["nope"]), {"prefix-caching": []})
    assert serving._selected(serving.Config(variants=[]), {"a": []}) == {}
    assert serving._selected(serving.Config(), {"a": ["x"]}) == {"a": ["x"]}


def check_metrics_declared(result):
    metrics = result.metrics()
    declared = yaml.safe_load(stages.get("serving").metrics_file.read_text())["metrics"]
    assert set(metrics) == set(declared)
    assert all(name.startswith("serving.") and declared[name]["description"] for name in declared)
    assert all(v is None or isinstance(v, float) for v in metrics.values())
    doc = json.loads(result.model_dump_json())
    assert serving.Result.model_validate(doc).metrics() == pytest.approx(metrics, nan_ok=True)
    assert serving.markdown(doc).startswith("## Serving features")
    return metrics, doc


# ------------------------------------------------------------------------- a real engine

def run_stage(endpoint, variants, **config):
    inputs = StageInputs(source=str(TINY_LLAMA), target=engine_target(variants=variants),
                         endpoint=endpoint)
    return serving.run(serving.Config(**config), inputs)


@pytest.mark.engine
def test_batching_only_without_variants(tiny_llama_engine):
    result = run_stage(tiny_llama_engine, {})
    metrics, doc = check_metrics_declared(result)
    assert result.batching.passed and result.batching.max_in_flight > 1
    assert result.batching.concurrency == 16 and result.batching.padding == 8
    assert metrics["serving.variants"] == 0 and metrics["serving.max_logprob_diff"] is None
    assert metrics["serving.batching.failed"] == 0 and metrics["serving.prefix_cache_hits"] is None
    assert metrics["serving.batching.max_logprob_diff"] <= result.tolerance == 0.05
    assert "only batching was checked" in result.notes[0]
    assert result.plan.shortest > 64 and result.plan.shared_prefix >= 128


# the built-in variants (prefix caching, chunked prefill) agreeing and hitting the cache: the
# launch-mode run of tests/engines/test_engine_e2e.py


@pytest.mark.engine
@pytest.mark.slow
def test_lossy_variant_and_cache_that_cannot_hit_fail(tiny_llama_engine):
    # one launch, two faults: fp8 KV cache changes the numbers; the name claims prefix caching
    # but the arguments keep it off, so the cache cannot hit
    result = run_stage(tiny_llama_engine, {
        "prefix-caching-fp8-kv": ["--kv-cache-dtype", "fp8", "--no-enable-prefix-caching"]})
    metrics, doc = check_metrics_declared(result)
    (row,) = result.variants
    assert not row.passed and row.vacuous and row.prefix_cache_hits == 0
    assert row.max_logprob_diff > 2 * result.tolerance  # 0.28 measured, tolerance 0.05
    assert any("> tolerance" in r for r in row.reasons)
    assert any("never hit" in r for r in row.reasons)
    assert metrics["serving.variants_failed"] == 1 and metrics["serving.variants_vacuous"] == 1
    assert metrics["serving.variants_over_tolerance"] == 1
    assert metrics["serving.prefix_cache_hits"] == 0
    assert any("prefix-caching-fp8-kv" in f for f in serving.findings(doc))


@pytest.mark.engine
@pytest.mark.slow
def test_variant_that_does_not_start_is_an_error(tiny_llama_engine):
    with pytest.raises(EngineStartError, match="exited with status"):
        run_stage(tiny_llama_engine, {"bad-flag": ["--no-such-engine-flag"]})
