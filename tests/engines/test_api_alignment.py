"""The api_alignment stage: a real vLLM for CPU against the in-process float32 reference and the
bf16 control, on the tiny-llama fixture; negative controls serve faulty copies of the fixture
(tests/engines/faults.py) while the reference reads the original.

The correct engine must pass every api_alignment gate of the shipped gates.yaml; the faults'
verdicts are checked end to end in test_engine_e2e.py.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch
import yaml

from day0.execution.contract import StageInputs
from day0.engines.client import EngineClient, EngineProtocolError
from day0.errors import TargetFault
from day0.verdict.gates import evaluate, load_gates
from day0.execution.stage import StageSpec, execute
from day0.engines.logprobs import Engine
from day0.stages.api_alignment.measures import truncated_kl
from tests.conftest import HELDOUT, ROOT
from tests.engines.conftest import TINY_LLAMA, engine_target



def failing(result) -> dict[str, str]:
    """Shipped gate id -> reason, for every api_alignment gate the result fails."""
    return {g.id: g.reason for g in evaluate(load_gates(ROOT / "gates.yaml"), result.metrics(),
                                             is_moe=False)
            if g.metric.startswith("api_alignment.") and not g.passed}


def _inputs(endpoint, source=TINY_LLAMA) -> StageInputs:
    return StageInputs(source=str(source), target=engine_target(), endpoint=endpoint)


def _run(endpoint, source=TINY_LLAMA, **config):
    from day0.stages.api_alignment.core import Config, run

    return run(Config(text_file=str(HELDOUT), **config), _inputs(endpoint, source))


# -- the correct engine --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def correct(tiny_llama_engine):
    """The stage through the runner's contract (spec in, JSON out), then as its Result."""
    from day0.stages.api_alignment.core import Result

    outcome = execute(StageSpec(stage="api_alignment", config={"text_file": str(HELDOUT)},
                                inputs=_inputs(tiny_llama_engine)))
    assert outcome.ok, outcome.error
    result = Result.model_validate(outcome.result)
    assert outcome.metrics == result.metrics()
    return result


@pytest.mark.engine
def test_correct_engine_passes_the_shipped_gates(correct):
    assert failing(correct) == {}
    m = correct.metrics()
    # the engine is as close to the reference as the control (a correct bf16 port)
    kl = correct.comparison("kl_topk")
    assert 0 < kl.target < 1e-3 and 0 < kl.control < 1e-3 and 0.3 < kl.ratio < 2.0
    assert abs(m["api_alignment.perplexity.engine"] / m["api_alignment.perplexity.reference"]
               - 1) < 0.01
    assert m["api_alignment.generation.control_not_close"] == 0
    assert correct.checkpoint_problems == [] and correct.nonfinite == 0 and not correct.moe


@pytest.mark.engine
def test_windows_reach_the_served_context(correct):
    assert correct.max_model_len == 256 and correct.seq_len == 255  # one token left to generate
    assert correct.top_k == 20 and correct.notes == []
    assert correct.windows == 4 and correct.context_tokens == 8
    assert correct.positions == correct.windows * (correct.seq_len - correct.context_tokens - 1)
    assert correct.buckets[-1].end == correct.seq_len
    assert sum(b.positions for b in correct.buckets) == correct.positions
    assert 0.3 < correct.topk_reference_mass < 1.0
    assert len(correct.generation) == 4 and all(g.tokens == 32 for g in correct.generation)
    assert correct.engine_fingerprint and "vllm" in correct.engine_fingerprint


@pytest.mark.engine
def test_metrics_are_declared_and_the_report_hooks_work(correct):
    from day0 import stages
    from day0 import stages

    stage = stages.get("api_alignment")

    declared = yaml.safe_load(stages.get("api_alignment").metrics_file.read_text())["metrics"]
    assert set(correct.metrics()) == set(declared)
    assert all(name.startswith("api_alignment.") and declared[name]["description"]
               for name in declared)
    data = json.loads(correct.model_dump_json())
    text = stage.markdown(data, [])
    assert "truncated KL" in text and "| kl_topk |" in text and "Greedy generation" in text
    assert stage.findings(data) == []
    (description, rows), = stage.tables(data).values()
    assert len(rows) == 4 and "KL" in description
    assert stage.plots(data)["kl-buckets"].startswith(b"\x89PNG")


@pytest.mark.engine
def test_top_k_and_seq_len_are_capped_by_the_engine(tiny_llama_engine):
    result = _run(tiny_llama_engine, top_k=25, seq_len=1000, max_windows=1,
                  generation_prompts=1, new_tokens=4)
    assert result.top_k == 20 and result.seq_len == 255
    assert any("at most 20 logprobs" in n for n in result.notes)
    assert any("seq_len 1000 lowered to 255" in n for n in result.notes)
    assert result.metrics()["api_alignment.generation.not_close"] == 0


# -- negative controls (rope_theta, one weight) run end to end, at the verdict: tests/engines/test_engine_e2e.py

# -- pieces, without an engine -------------------------------------------------------------------

def test_truncated_kl_renormalizes_over_the_set():
    log_r = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64), -1)
    idx = torch.tensor([[0, 1, 3]])
    mask = torch.tensor([[True, True, False]])       # S = {0, 1}: the padding entry is ignored
    same = log_r.gather(1, idx) - 0.7                 # a constant shift: invisible inside S
    kl, mass = truncated_kl(log_r, idx, same, mask)
    assert kl.item() == pytest.approx(0.0, abs=1e-12)
    assert mass.item() == pytest.approx(float(log_r[0, :2].exp().sum()))
    other = torch.log(torch.tensor([[0.5, 0.5, 0.1]], dtype=torch.float64))
    kl, _ = truncated_kl(log_r, idx, other, mask)
    p = torch.softmax(torch.tensor([2.0, 1.0], dtype=torch.float64), 0)
    assert kl.item() == pytest.approx(float((p * (p / 0.5).log()).sum()))
    nan = torch.tensor([[math.nan, -1.0, 0.0]], dtype=torch.float64)
    assert math.isnan(truncated_kl(log_r, idx, nan, mask)[0].item())


def _engine(handler) -> Engine:
    client = EngineClient("http://engine.test")
    client._http = httpx.Client(base_url="http://engine.test",
                                transport=httpx.MockTransport(handler))
    return Engine(client, "m")


def _answer(rows, echoed=None, **extra):
    # json.dumps writes NaN as vLLM's Python JSON encoders would (not strict JSON)
    body = {"choices": [{"prompt_logprobs": rows, "prompt_token_ids": echoed, **extra}]}
    return httpx.Response(200, content=json.dumps(body).encode(),
                          headers={"content-type": "application/json"})


def test_prompt_logprobs_are_parsed_with_ties_and_the_actual_token():
    rows = [None,
            # the actual token 7 is outside the top-2; 4 and 5 tie (vLLM ranks them 1 and 2)
            {"7": {"logprob": -5.0, "rank": 9}, "4": {"logprob": -0.5, "rank": 1},
             "5": {"logprob": -0.5, "rank": 2}},
            {"8": {"logprob": -0.1, "rank": 1}, "3": {"logprob": float("nan"), "rank": 2}}]
    engine = _engine(lambda request: _answer(rows, [1, 7, 8]))
    got = engine.window([1, 7, 8], 2)
    assert got.actual[0] == -5.0 and got.top[0] == {4: -0.5, 5: -0.5}
    assert got.rank1[0] == {4, 5} and got.rank1[1] == {8}
    assert got.nonfinite == 1
    # an engine that gives no ranks: k + 1 entries hold the actual token besides the top-k
    unranked = [None, {"7": {"logprob": -5.0}, "4": {"logprob": -0.5}, "5": {"logprob": -0.6}},
                {"8": {"logprob": -0.1}, "3": {"logprob": -2.0}}]
    got = _engine(lambda request: _answer(unranked, [1, 7, 8])).window([1, 7, 8], 2)
    assert got.top == [{4: -0.5, 5: -0.6}, {8: -0.1, 3: -2.0}] and got.actual == [-5.0, -0.1]


def test_an_engine_that_changes_the_prompt_or_drops_logprobs_is_caught():
    rows = [None, {"7": {"logprob": -1.0, "rank": 1}}]
    with pytest.raises(TargetFault, match="changed the prompt"):
        _engine(lambda request: _answer(rows, [0, 1, 7])).window([1, 7], 2)
    with pytest.raises(EngineProtocolError, match="lacks the prompt's own token"):
        _engine(lambda request: _answer([None, {"9": {"logprob": -1.0, "rank": 1}}],
                                        [1, 7])).window([1, 7], 2)
    with pytest.raises(EngineProtocolError, match="prompt_logprobs has"):
        _engine(lambda request: _answer(None, [1, 7])).window([1, 7], 2)


def _chat_answer(content, **choice):
    body = {"choices": [{"logprobs": {"content": content}, **choice}]}
    return lambda request: httpx.Response(200, content=json.dumps(body).encode(),
                                          headers={"content-type": "application/json"})


def test_a_malformed_chat_answer_is_the_engines_protocol_error():
    good = [{"token": "token_id:5", "logprob": -0.1,
             "top_logprobs": [{"token": "token_id:5", "logprob": -0.1},
                              {"token": "token_id:6", "logprob": float("-inf")}]}]
    prompt, answer = _engine(_chat_answer(good, token_ids=[5])).chat_greedy([], None, 1, 2)
    assert prompt is None and answer.steps == [(5, {5: -0.1, 6: float("-inf")})]
    assert answer.nonfinite == 1
    for content in ([{"logprob": -0.1}], [{"token": "token_id:5", "top_logprobs": [{}]}],
                    ["token_id:5"], [{"token": "token_id:5", "logprob": -0.1,
                                      "top_logprobs": [{"token": "token_id:5", "logprob": "x"}]}]):
        with pytest.raises(EngineProtocolError, match=r"logprobs.content\[0\]"):
            _engine(_chat_answer(content)).chat_greedy([], None, 1, 2)
    with pytest.raises(EngineProtocolError, match="differ from token_ids"):
        _engine(_chat_answer(good, token_ids=[6])).chat_greedy([], None, 1, 2)


def test_a_malformed_completion_is_the_engines_protocol_error():
    def answer(body):
        return lambda request: httpx.Response(200, json=body)

    with pytest.raises(EngineProtocolError, match="no 'choices'"):
        _engine(answer({"error": "overloaded"})).greedy([[1, 2]], 1, 2)
    bad_top = {"choices": [{"token_ids": [5], "logprobs": {"top_logprobs": [["token_id:5"]]}}]}
    with pytest.raises(EngineProtocolError, match="step 0"):
        _engine(answer(bad_top)).greedy([[1, 2]], 1, 2)


def test_top_k_is_lowered_to_what_the_engine_allows():
    def handler(request):
        k = json.loads(request.content)["prompt_logprobs"]
        if k > 5:
            return httpx.Response(400, json={"error": {"message": f"Requested prompt logprobs "
                                                       f"of {k}, which is greater than max "
                                                       "allowed: 5"}})
        return _answer([None, {"1": {"logprob": 0.0, "rank": 1}}])

    assert _engine(handler).cap_top_k(20, [1, 2]) == (
        5, "the engine allows at most 5 logprobs (its max_logprobs); top_k 20 lowered to 5")
    assert _engine(handler).cap_top_k(3, [1, 2]) == (3, None)


def test_in_process_greedy_with_a_cache_equals_full_forwards():
    from day0.checkpoint.modeling import load_pretrained
    from day0.torchkit.inprocess import Side

    side = Side("reference", load_pretrained(TINY_LLAMA), "cpu")
    batch = [[0, 40, 41, 42, 43], [0, 50, 51, 52, 53]]
    steps = side.greedy(batch, 6, 3)
    for prompt, row in zip(batch, steps):
        ids = list(prompt)
        for token, top in row:
            (_, logits), = side.logits(ids, chunk=1024)
            full = torch.log_softmax(logits[-1].double(), -1)
            assert token == int(full.argmax()) and len(top) == 3 and token in top
            assert top[token] == pytest.approx(float(full[token]), abs=1e-4)
            ids.append(token)


def test_in_process_chunks_over_a_cache_equal_one_forward():
    from day0.checkpoint.modeling import load_pretrained
    from day0.torchkit.inprocess import Side

    side = Side("reference", load_pretrained(TINY_LLAMA), "cpu")
    ids = [0] + list(range(40, 140))
    (_, whole), = side.logits(ids, chunk=1024)
    parts = list(side.logits(ids, chunk=32))
    assert [start for start, _ in parts] == [0, 32, 64, 96]
    assert torch.allclose(torch.cat([p for _, p in parts]), whole, atol=1e-4)


def test_an_engine_target_without_an_endpoint_is_a_config_error():
    from day0.errors import ConfigError
    from day0.stages.api_alignment.core import Config, run

    with pytest.raises(ConfigError, match="needs an engine target and its endpoint"):
        run(Config(), _inputs(None))


def test_moe_checkpoints_are_recognised():
    from day0.stages.api_alignment.core import _is_moe
    from tests.conftest import MODELS
    from transformers import AutoConfig

    assert _is_moe(AutoConfig.from_pretrained(MODELS / "tiny-qwen3moe"))
    assert _is_moe(AutoConfig.from_pretrained(MODELS / "tiny-deepseekv3"))
    assert not _is_moe(AutoConfig.from_pretrained(TINY_LLAMA))
