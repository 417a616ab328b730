"""The chat stage on a real vLLM for CPU serving the tiny-llama fixture: through the runner's
contract (spec in, JSON out) every shipped chat gate passes, every conversation is answered
alike on the four sides, and a user's conversations are added (a tool-call one left out, noted,
where the template renders no tools). The negative controls (rope_theta, o_proj x 0.5, swapped
special tokens) fail it end to end in test_engine_e2e.py; the real SmolLM2 in test_real_model.py.
"""

from __future__ import annotations

import json

import pytest

from day0.execution.contract import StageInputs
from day0.execution.stage import StageSpec, execute
from day0.stages.chat.report import findings, markdown, tables
from day0.verdict.gates import evaluate, load_gates
from tests.conftest import ROOT
from tests.engines.conftest import TINY_LLAMA, engine_target

pytestmark = [pytest.mark.engine]


def failing(metrics) -> dict[str, str]:
    return {g.id: g.reason for g in evaluate(load_gates(ROOT / "gates.yaml"), metrics,
                                             is_moe=False)
            if g.metric.startswith("chat.") and not g.passed}


@pytest.fixture(scope="module")
def correct(tiny_llama_engine, tmp_path_factory):
    from day0.stages.chat.core import Result

    mine = tmp_path_factory.mktemp("chat") / "mine.jsonl"
    mine.write_text("\n".join(json.dumps(row) for row in [
        {"id": "mine", "messages": [{"role": "user", "content": "Name a colour."}]},
        {"id": "my-tool", "tools": [{"type": "function", "function": {"name": "f"}}],
         "messages": [{"role": "user", "content": "Call f."}]}]))
    outcome = execute(StageSpec(stage="chat", config={"conversations_file": str(mine)},
                                inputs=StageInputs(source=str(TINY_LLAMA), target=engine_target(),
                                                   endpoint=tiny_llama_engine)))
    assert outcome.ok, outcome.error
    result = Result.model_validate(outcome.result)
    assert outcome.metrics == result.metrics()
    return result


def test_the_correct_engine_passes_every_chat_gate(correct):
    m = correct.metrics()
    assert failing(m) == {}
    assert m["chat.conversations"] == 9 and m["chat.not_close"] == 0
    assert m["chat.prompt_mismatches"] == 0 and m["chat.path_mismatches"] == 0
    assert m["chat.not_greedy_steps"] == 0 and correct.generation_defaults == {}
    # a correct bf16 engine is about as far from the float32 reference as the bf16 control
    for name in ("prefill_error", "decode_error"):
        found = correct.comparison(name)
        assert 0 < found.target < 0.05 and 0 < found.control < 0.05 and 0.3 < found.ratio < 2
    assert correct.request == {"temperature": 0, "max_tokens": 24, "ignore_eos": True,
                               "logprobs": True, "top_logprobs": 20}


def test_every_conversation_is_answered_alike_and_the_users_are_added(correct):
    rows = {r.id: r for r in correct.conversations}
    assert "mine" in rows and "my-tool" not in rows and "tool-call" not in rows
    assert any("'my-tool' left out: the chat template renders no tools" in n
               for n in correct.notes)
    for row in rows.values():
        assert row.prompt_matches and row.path_agrees and row.close and row.control_close
        assert row.where in ("", "near-tie") and row.tokens == 24
        assert row.engine_text and row.reference_text


def test_the_report_shows_each_conversation_and_no_finding(correct):
    evidence = json.loads(correct.model_dump_json())
    text = markdown(evidence)
    assert "## Chat" in text and "| mine |" in text and "near-tie bound 0.5" in text
    assert findings(evidence) == []
    assert len(tables(evidence)["day0-chat-conversations"][1]) == 9


def test_a_tool_call_conversation_is_answered_where_the_template_renders_tools(tmp_path):
    """A copy of the fixture whose chat template renders tools and tool calls, served and read
    alike: the engine renders the bundled tool-call conversation (tools, an assistant tool call
    with JSON-string arguments, the tool's answer) to the checkpoint's ids and answers it."""
    from day0.engines.process import launched
    from day0.stages.chat.core import Config, run
    from tests.engines.faults import copy_fixture
    from tests.stages.chat.test_core import TOOLS_TEMPLATE

    copy = copy_fixture(tmp_path / "tools")
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config,
                                                            "chat_template": TOOLS_TEMPLATE}))
    target = engine_target()
    with launched(target.engine, copy, "bfloat16", name="tools") as engine:
        result = run(Config(), StageInputs(source=str(copy), target=target,
                                           endpoint=engine.endpoint))
    rows = {r.id: r for r in result.conversations}
    assert result.notes == [] and "tool-call" in rows
    tool = rows["tool-call"]
    assert tool.prompt_matches and tool.path_agrees and tool.close, tool
    assert failing(result.metrics()) == {}
