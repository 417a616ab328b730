"""The smoke stage: pure parity helpers (no engine) and the stage on the real vLLM serving
tiny-llama (every check passes). Its negative control (an engine serving a copy whose tokenizer
ids of BOS/EOS and two common tokens are swapped) runs at the verdict in test_engine_e2e.py."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml

from day0 import stages
from day0.execution.contract import StageInputs
from day0.engines.client import EngineUnreachable
from day0.engines.process import free_port
from day0.engines.settings import Endpoint
from day0.errors import ConfigError
from day0.stages.smoke import core as smoke
from day0.stages.smoke import report as smoke_report
from day0.stages.smoke.checks import Session
from day0.stages.smoke.load import concurrency_check, overlong_prompt
from day0.stages.smoke.parity import (chat_ids, chat_steps, compare_ids, completion_steps,
                                      first_difference, load_conversations, load_texts,
                                      special_texts, stop_string)
from day0.stages.smoke.result import Check, ChatTemplateParity, Result, TokenizerParity
from tests.engines.conftest import TINY_LLAMA, engine_target

METRICS_FILE = stages.get("smoke").metrics_file
SMALL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "model.safetensors.index.json")


@pytest.fixture(scope="module")
def tokenizer():
    from day0.torchkit.evaltext import load_tokenizer

    return load_tokenizer(TINY_LLAMA)


def _copy(dest: Path, *, chat_template: bool = True) -> Path:
    """A copy of tiny-llama (optionally without its chat template); a link out of a checkpoint
    is refused as hostile, so the shards are copied too (3 MB)."""
    dest.mkdir(parents=True)
    for name in SMALL_FILES:
        shutil.copy(TINY_LLAMA / name, dest / name)
    for shard in TINY_LLAMA.glob("*.safetensors"):
        shutil.copy(shard, dest / shard.name)
    if not chat_template:
        config = json.loads((dest / "tokenizer_config.json").read_text())
        config.pop("chat_template")
        (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return dest


def _run(endpoint: Endpoint, source: Path = TINY_LLAMA, **config) -> Result:
    return smoke.run(smoke.Config(**config),
                     StageInputs(source=str(source), target=engine_target(), endpoint=endpoint))


# -- pure helpers ---------------------------------------------------------------------------
def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([], []) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a prefix differs at the shorter length
    assert first_difference([], [7]) == 0


def test_compare_ids_reports_the_first_difference():
    assert compare_ids("same", [0, 5, 6], [0, 5, 6]) is None
    m = compare_ids("bos", [1, 5, 6], [0, 5, 6], preview="'x'")
    assert (m.case, m.index, m.engine_id, m.checkpoint_id, m.engine_len, m.checkpoint_len) == (
        "bos", 0, 1, 0, 3, 3)
    longer = compare_ids("tail", [4, 5, 6, 7], [4, 5, 6])
    assert (longer.index, longer.engine_id, longer.checkpoint_id) == (3, 7, None)


def test_bundled_texts_cover_the_hard_cases():
    cases = dict(load_texts())
    assert len(cases) >= 25 and all(cases.values())
    joined = "".join(cases.values())
    for needle in ("  ", "\t", "\n", "\r\n", "é", "e\u0301", "你", "👨\u200d👩", "def ", "<|endoftext|>"):
        assert needle in joined, needle
    assert max(len(w) for t in cases.values() for w in t.split()) >= 100  # a very long word
    assert all(len(messages) >= 1 for _, messages in load_conversations())
    roles = {tuple(m["role"] for m in messages) for _, messages in load_conversations()}
    assert ("system", "user") in roles and any(r.count("user") >= 2 for r in roles)


@pytest.mark.parametrize("line, why", [
    ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}', "used twice"),
    ('{"id": "a", "text": ""}', "non-empty"),
    ('{"id": "a"}', "lacks"),
    ("not json", "not JSON"),
])
def test_bad_text_files_are_config_errors(tmp_path, line, why):
    path = tmp_path / "texts.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=why):
        load_texts(path)


def test_special_texts_and_chat_ids_of_the_checkpoint(tokenizer):
    cases = dict(special_texts(tokenizer))
    assert cases["special:<|bos|>"] == "<|bos|>" and cases["special:<|eos|>"] == "<|eos|>"
    assert "special:all" in cases and "special:in-text" in cases
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ids = chat_ids(tokenizer, messages)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.eos_token_id) == 2
    assert rendered.endswith("assistant<|end_header_id|>\n\n")


def test_conversations_the_checkpoint_template_refuses_are_left_out(tokenizer):
    from day0.stages.smoke.tokens import renderable

    strict = copy.deepcopy(tokenizer)
    strict.chat_template = ("{% if messages[0]['role'] == 'system' %}"
                            "{{ raise_exception('System role not supported') }}{% endif %}"
                            "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    session = Session(config=smoke.Config(), client=None, served="m", tokenizer=strict)
    kept = renderable(session, load_conversations())
    assert [case for case, _ in kept] == ["user-only", "whitespace-unicode"]
    assert len(session.notes) == 2 and "System role not supported" in session.notes[0]


def test_logprob_steps_parse_token_ids():
    completion = {"tokens": ["token_id:9", "token_id:11"],
                  "top_logprobs": [{"token_id:9": -0.1, "token_id:72": -2.0}, {"token_id:11": -0.5}]}
    assert completion_steps(completion) == [(9, {9: -0.1, 72: -2.0}), (11, {11: -0.5})]
    assert completion_steps({"tokens": ["'", ")"], "top_logprobs": [{}, {}]}) == []  # text: no ids
    assert completion_steps(None) == []
    chat = {"content": [{"token": "token_id:5", "logprob": -0.2,
                         "top_logprobs": [{"token": "token_id:5", "logprob": -0.2},
                                          {"token": "token_id:6", "logprob": -1.0}]}]}
    assert chat_steps(chat) == [(5, {5: -0.2, 6: -1.0})]


def test_stop_string_is_a_first_occurrence_after_the_start():
    assert stop_string("abcabc") == "b"
    assert stop_string("\n\nReturn") == "R"
    assert stop_string("aaaa") is None
    assert stop_string("   ") is None
    text = "'))),"
    stop = stop_string(text)
    assert text.find(stop) >= 1 and stop not in text[:text.find(stop)]


def test_overlong_prompt_just_exceeds_the_limit(tokenizer):
    text, count = overlong_prompt(tokenizer, 256, 8)
    assert count == len(tokenizer(text)["input_ids"])
    assert 264 <= count <= 272


def _result(checks: list[Check], chat: ChatTemplateParity, tok_mismatches=()) -> Result:
    return Result(served_name="m", base_url="http://x", checks=checks,
                  tokenizer=TokenizerParity(via="/tokenize", cases=10,
                                            mismatches=list(tok_mismatches)),
                  chat_template=chat, wall_s=1.0)


def test_metrics_are_the_declared_ones_and_not_applicable_is_loud():
    declared = set(yaml.safe_load(METRICS_FILE.read_text())["metrics"])
    mismatch = compare_ids("special:<|bos|>", [1], [0], preview="'<|bos|>'")
    checks = [Check(name="tokenizer.parity", family="tokenizer", passed=False, detail="1 of 10"),
              Check(name="models.listed", family="api", passed=True),
              Check(name="chat.text", family="api", passed=None, detail="not applicable: x")]
    result = _result(checks, ChatTemplateParity(applicable=False, note="no chat template"),
                     [mismatch])
    metrics = result.metrics()
    assert set(metrics) == declared
    assert metrics["smoke.checks_failed"] == 1 and metrics["smoke.checks_run"] == 2
    assert metrics["smoke.checks_not_applicable"] == 1
    assert metrics["smoke.tokenizer.mismatches"] == 1
    assert metrics["smoke.chat_template.mismatches"] == 0  # parity of absence: nothing invented
    evidence = result.model_dump(mode="json")
    lines = smoke_report.findings(evidence)
    assert lines[0].startswith("smoke: tokenizer.parity failed") and len(lines) == 2
    assert "not applicable" in lines[1]
    text = smoke_report.markdown(evidence, [])
    assert "**FAIL**" in text and "special:<\\|bos\\|>" in text and "n/a" in text


def test_stage_declaration():
    stage = stages.get("smoke")
    assert stage.target_kinds == ("engine",) and stage.uses_endpoint
    assert stage.after == ("analysis",) and stage.requires == ()
    assert stages.plan(["smoke"], "engine") == [["analysis"], ["smoke"]]


def test_an_engine_that_is_gone_is_an_error_not_a_failed_check(tokenizer):
    down = Endpoint(base_url=f"http://127.0.0.1:{free_port()}", served_name="m", mode="attach")
    with pytest.raises(EngineUnreachable):
        _run(down)
    session = Session(config=smoke.Config(), client=None, served="m", tokenizer=tokenizer)
    with pytest.raises(EngineUnreachable):  # raised in a worker thread, re-raised here
        concurrency_check(session, down, timeout_s=5)
    assert session.checks == []


# -- the real engine ------------------------------------------------------------------------
@pytest.mark.engine
def test_every_check_passes_on_the_correct_engine(tiny_llama_engine, tokenizer):
    result = _run(tiny_llama_engine)
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.passed]
    assert not failed, failed  # not applicable counts too: every check applies here
    metrics = result.metrics()
    texts = len(load_texts()) + len(special_texts(tokenizer))
    assert metrics == {
        "smoke.checks_run": len(result.checks), "smoke.checks_failed": 0,
        "smoke.checks_not_applicable": 0, "smoke.api.failed": 0, "smoke.stream.mismatches": 0,
        "smoke.usage.mismatches": 0, "smoke.detokenize.mismatches": 0,
        "smoke.tokenizer.texts": texts, "smoke.tokenizer.mismatches": 0,
        "smoke.chat_template.conversations": len(load_conversations()),
        "smoke.chat_template.mismatches": 0, "smoke.overlong.rejected": 1,
        "smoke.overlong.healthy_after": 1, "smoke.concurrency.requests": 16,
        "smoke.concurrency.failed": 0}
    names = {c.name for c in result.checks}
    for kind in ("completion", "chat"):
        assert {f"{kind}.{n}" for n in ("text", "max_tokens", "usage", "detokenize", "stream_text",
                                        "stream_matches", "stop")} <= names
    assert result.tokenizer.via == "/tokenize" and result.overlong.status == 400
    assert result.overlong.prompt_tokens > result.overlong.max_model_len == 256
    assert smoke_report.findings(result.model_dump(mode="json")) == []


@pytest.mark.engine
def test_prompt_ids_from_completions_where_there_is_no_tokenize(tiny_llama_engine):
    result = _run(tiny_llama_engine, tokenize_via="completion")
    assert result.tokenizer.via == "prompt_token_ids of completions"
    assert result.tokenizer.mismatches == [] and result.chat_template.mismatches == []
    assert result.tokenizer.cases > 30 and result.chat_template.conversations == 4


@pytest.mark.engine
def test_a_checkpoint_without_chat_template_needs_an_engine_without_one(tiny_llama_engine,
                                                                          tmp_path):
    """Parity of absence: the checkpoint renders no chat prompt, but the engine (serving the
    fixture, which has a template) builds one for every conversation: each is a mismatch;
    chat completions themselves are not checked."""
    source = _copy(tmp_path / "no-template", chat_template=False)
    result = _run(tiny_llama_engine, source)
    chat = [c for c in result.checks if c.name.startswith("chat.")]
    assert len(chat) == 7 and all(c.passed is None and "no chat template" in c.detail
                                  for c in chat)
    parity = next(c for c in result.checks if c.name == "chat_template.parity")
    assert parity.passed is False
    metrics = result.metrics()
    assert metrics["smoke.chat_template.conversations"] == 4
    assert metrics["smoke.chat_template.mismatches"] == 4
    assert metrics["smoke.checks_not_applicable"] == 7 and metrics["smoke.checks_failed"] == 1
    assert metrics["smoke.tokenizer.mismatches"] == 0
    assert all("no template" in m.error for m in result.chat_template.mismatches)


@pytest.mark.engine
def test_an_engine_dying_mid_stage_ends_it_with_error(tiny_llama_engine, monkeypatch):
    from day0.engines.client import EngineClient

    real_send, calls = EngineClient.send, []

    def send(self, method, path, body=None):
        calls.append(path)
        if len(calls) > 12:  # after the listing and a few tokenizer texts
            raise EngineUnreachable(f"{method} {path}: connection reset (simulated)")
        return real_send(self, method, path, body)

    monkeypatch.setattr(EngineClient, "send", send)
    with pytest.raises(EngineUnreachable, match="simulated"):
        _run(tiny_llama_engine)


# the negative control (a tokenizer whose special-token ids differ) runs end to end, at the
# verdict: tests/engines/test_engine_e2e.py
