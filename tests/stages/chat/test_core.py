"""Which conversations the chat stage answers on a checkpoint, without an engine: a tool-call
one only where the chat template renders tools (its arguments given to the template as a
mapping, as vLLM gives them), none that leaves no room for the answer, and a checkpoint without
a chat template is a config error naming the fix."""

from __future__ import annotations

import pytest

from day0.errors import ConfigError
from day0.stages.chat.conversations import BUNDLED, load
from day0.stages.chat.core import _renderable, generation_defaults
from day0.torchkit.evaltext import load_tokenizer
from tests.conftest import MODELS

TOOLS_TEMPLATE = (
    "{%- if tools %}tools: {% for t in tools %}{{ t.function.name }} {% endfor %}{{ eos_token }}"
    "{% endif %}{%- for m in messages %}{{ m.role }}: {%- if m.tool_calls %}"
    "{% for c in m.tool_calls %} {{ c.function.name }}({{ c.function.arguments.city }})"
    "{% endfor %}{% else %} {{ m.content }}{% endif %}{{ eos_token }}{%- endfor %}"
    "{%- if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture
def tokenizer():
    return load_tokenizer(MODELS / "tiny-llama")


def test_a_tool_call_conversation_runs_only_where_the_template_renders_tools(tokenizer):
    notes: list[str] = []
    kept = _renderable(tokenizer, load(BUNDLED), 10_000, notes)
    assert "tool-call" not in [c.id for c, _ in kept] and len(kept) == len(load(BUNDLED)) - 1
    assert notes == ["'tool-call' left out: the chat template renders no tools"]

    tokenizer.chat_template = TOOLS_TEMPLATE
    notes = []
    kept = dict((c.id, ids) for c, ids in _renderable(tokenizer, load(BUNDLED), 10_000, notes))
    assert notes == [] and "tool-call" in kept
    text = tokenizer.decode(kept["tool-call"])
    assert "tools: get_weather" in text and "get_weather(Paris)" in text  # arguments: a mapping


def test_no_room_for_the_answer_leaves_a_conversation_out_and_none_left_is_an_error(tokenizer):
    notes: list[str] = []
    with pytest.raises(ConfigError, match="no conversation fits"):
        _renderable(tokenizer, load(BUNDLED), 5, notes)
    assert all("leave no room for the answer" in n or "renders no tools" in n for n in notes)
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match="no chat template") as caught:
        _renderable(tokenizer, load(BUNDLED), 10_000, [])
    assert "leave out the chat stage" in str(caught.value)


def test_the_request_defaults_an_engine_takes_from_generation_config(tmp_path):
    assert generation_defaults(str(MODELS / "tiny-llama")) == {}  # do_sample, lengths: not these
    (tmp_path / "generation_config.json").write_text(
        '{"do_sample": true, "repetition_penalty": 1.1, "top_p": 0.9, "max_new_tokens": 64}')
    assert generation_defaults(str(tmp_path)) == {"repetition_penalty": 1.1, "top_p": 0.9,
                                                  "max_new_tokens": 64}
    (tmp_path / "generation_config.json").write_text("[not an object")
    assert generation_defaults(str(tmp_path)) == {}
