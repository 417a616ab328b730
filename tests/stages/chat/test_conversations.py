"""The chat stage's conversations: the bundled set loads, a user's file adds to it, and a bad
file is one ConfigError naming every bad line (exit 2 at the CLI), never a traceback."""

from __future__ import annotations

import json

import pytest

from day0.errors import ConfigError
from day0.stages.chat.conversations import BUNDLED, conversations, load


def test_the_bundled_set_covers_the_kinds_of_conversation():
    rows = load(BUNDLED)
    roles = [[m["role"] for m in c.messages] for c in rows]
    assert any(r == ["user"] for r in roles)                       # single turn
    assert any(r[0] == "system" and len(r) == 2 for r in roles)    # with a system prompt
    assert any(r.count("user") >= 2 for r in roles)                # multi-turn
    assert any(c.tools for c in rows)                              # tool-call formatted
    assert len({c.id for c in rows}) == len(rows)


def test_a_users_file_is_answered_after_the_bundled_ones(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"id": "mine", "messages": [{"role": "user", "content": "Hi"}]})
                    + "\n\n")
    rows = conversations(True, str(mine))
    assert rows[-1].id == "mine" and len(rows) == len(load(BUNDLED)) + 1
    assert [c.id for c in conversations(False, str(mine))] == ["mine"]


def test_every_bad_line_is_named_at_once(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([
        json.dumps({"id": "ok", "messages": [{"role": "user", "content": "Hi"}]}),
        "{not json",
        json.dumps({"id": "empty", "messages": []}),
        json.dumps({"id": "extra", "messages": [{"role": "user", "content": "x"}], "tool": 1}),
        json.dumps({"id": "ok", "messages": [{"role": "user", "content": "again"}]})]))
    with pytest.raises(ConfigError) as caught:
        load(bad)
    text = str(caught.value)
    assert "line 2: not JSON" in text and "line 3: messages" in text and "line 4: tool" in text
    assert "'ok' appears twice" in text and caught.value.file == str(bad)


def test_a_bundled_id_in_your_file_is_refused(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"id": "fact", "messages": [{"role": "user", "content": "Hi"}]}))
    with pytest.raises(ConfigError, match="rename yours"):
        conversations(True, str(mine))
    with pytest.raises(ConfigError, match="no conversation"):
        conversations(False, None)


def test_a_bad_file_given_to_validate_is_exit_2_before_anything_starts(tmp_path):
    """`--chat-conversations` is read when the options are: one line naming the file and its bad
    lines, exit 2, no engine launched and no server started (well under a second of work)."""
    import subprocess
    import sys

    from tests.conftest import MODELS

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "messages": []}\n{not json\n')
    proc = subprocess.run([sys.executable, "-m", "day0.cli", "validate", str(MODELS / "tiny-llama"),
                           "--target", "vllm-cpu-bf16", "--stages", "chat",
                           "--chat-conversations", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    message = proc.stderr.strip()
    assert len(message.splitlines()) == 1 and message.startswith("day0: error:")
    assert str(bad) in message and "line 1: messages" in message and "line 2: not JSON" in message
