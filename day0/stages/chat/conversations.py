"""The chat stage's conversations: the bundled set (data/conversations.jsonl) and a user's own
JSONL, one conversation per line: {"id", "messages": [{role, content, ...}], "tools"?: [...]}.

A conversation with ``tools`` is a tool-call formatted one: it runs only where the checkpoint's
chat template renders tools (the template names ``tools``); elsewhere it is left out, noted.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from day0.errors import ConfigError

BUNDLED = Path(__file__).parent / "data" / "conversations.jsonl"


class Conversation(BaseModel):
    """One conversation, answered greedily by every side."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="Unique name, shown in the report.")
    messages: list[dict] = Field(min_length=1, description=(
        "OpenAI chat messages, each with a string role; the last one is what the model "
        "answers (the generation prompt is added)."))
    tools: list[dict] | None = Field(None, description=(
        "OpenAI tool definitions; the conversation runs only where the chat template renders "
        "tools."))


def load(path: str | Path) -> list[Conversation]:
    """Every conversation of a JSONL file; every bad line at once, each naming its line."""
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read conversations: {exc}", file=str(file),
                          fix="give a UTF-8 JSONL file, one conversation per line") from None
    out, problems = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = Conversation.model_validate(json.loads(line))
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: not JSON ({exc.msg})")
            continue
        except ValidationError as exc:
            problems += [f"line {number}: {'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}"
                         for e in exc.errors()]
            continue
        if not all(isinstance(m.get("role"), str) for m in row.messages):
            problems.append(f"line {number}: every message needs a string role")
        out.append(row)
    seen: set[str] = set()
    problems += [f"id '{c.id}' appears twice" for c in out if c.id in seen or seen.add(c.id)]
    if problems or not out:
        raise ConfigError("; ".join(problems[:5]) or "no conversation", file=str(file),
                          fix='one JSON object per line: {"id": "fact", "messages": '
                              '[{"role": "user", "content": "Hi"}]}')
    return out


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as a checkpoint's chat template takes them: the OpenAI API carries a tool
    call's arguments as a JSON string, templates read a mapping (vLLM converts them likewise
    before it renders)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message = {**message, "tool_calls": [_parsed_arguments(c) for c in calls]}
        out.append(message)
    return out


def _parsed_arguments(call):
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def conversations(bundled: bool, extra: str | None) -> list[Conversation]:
    """The bundled set (unless turned off), then the user's file's; ids stay unique."""
    rows = (load(BUNDLED) if bundled else []) + (load(extra) if extra else [])
    ids = [c.id for c in rows]
    if twice := sorted({i for i in ids if ids.count(i) > 1}):
        raise ConfigError(f"conversation ids {twice} are both bundled and in your file",
                          file=str(extra), field="id", fix="rename yours")
    if not rows:
        raise ConfigError("no conversation to answer", field="bundled_conversations",
                          fix="keep the bundled ones or give conversations_file")
    return rows


__all__ = ["Conversation", "load", "conversations", "template_messages", "BUNDLED"]
