"""Pure helpers of the smoke stage: token-id parity, the bundled cases, parsing engine answers.

Nothing here talks to an engine or loads a tokenizer: the checks (checks.py, load.py) call these
with what they got, and the unit tests call them directly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from day0.errors import ConfigError
from day0.torchkit.evaltext import chat_ids

SMOKE_DATA = Path(__file__).parent / "data"
TEXTS_FILE = SMOKE_DATA / "tokenizer_texts.jsonl"
CONVERSATIONS_FILE = SMOKE_DATA / "conversations.jsonl"
TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids spelling of a token


class Mismatch(BaseModel):
    """Where the engine's token ids of one case part from the checkpoint tokenizer's."""

    model_config = ConfigDict(extra="forbid")

    case: str = Field(description="Id of the text or conversation.")
    index: int = Field(description="First differing position (the shorter length when one is a "
                                   "prefix of the other).")
    engine_id: int | None = Field(description="The engine's id there (None: its list ended).")
    checkpoint_id: int | None = Field(description="The checkpoint tokenizer's id there.")
    engine_len: int
    checkpoint_len: int
    preview: str = Field("", description="The start of the text (repr), for the report.")
    error: str = Field("", description="The engine refused the case (its HTTP error).")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ (a length difference counts at the
    shorter length); None when equal."""
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_ids(case: str, engine: list[int], checkpoint: list[int],
                preview: str = "") -> Mismatch | None:
    """None when the engine's ids equal the checkpoint's, else the first difference."""
    index = first_difference(engine, checkpoint)
    if index is None:
        return None
    return Mismatch(case=case, index=index,
                    engine_id=engine[index] if index < len(engine) else None,
                    checkpoint_id=checkpoint[index] if index < len(checkpoint) else None,
                    engine_len=len(engine), checkpoint_len=len(checkpoint), preview=preview)


def describe(m: Mismatch) -> str:
    if m.error:
        return f"{m.case}: the engine refused it: {m.error}"
    return (f"{m.case}: first difference at token {m.index}: engine {m.engine_id} vs checkpoint "
            f"{m.checkpoint_id} (lengths {m.engine_len} vs {m.checkpoint_len})")


def short(text: str, chars: int = 160) -> str:
    """One line of at most about chars characters (engine error bodies can be long)."""
    line = " ".join(str(text).split())
    return line if len(line) <= chars else line[:chars] + "..."


def preview(text: str, chars: int = 40) -> str:
    return repr(text if len(text) <= chars else text[:chars] + "...")


# -- bundled cases -------------------------------------------------------------------------
def _jsonl(path: Path, field: str) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read smoke cases: {exc}", file=str(path),
                          fix="give a UTF-8 JSONL file, one object per line") from None
    rows, seen = [], set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"line {number} is not JSON ({exc})", file=str(path),
                              fix="one JSON object per line") from None
        if not isinstance(row, dict) or not isinstance(row.get("id"), str) or field not in row:
            raise ConfigError(f"line {number} lacks 'id' (a string) or '{field}'", file=str(path),
                              fix=f'write {{"id": "...", "{field}": ...}}')
        if row["id"] in seen:
            raise ConfigError(f"line {number}: id '{row['id']}' used twice", file=str(path),
                              fix="give every case its own id")
        seen.add(row["id"])
        rows.append(row)
    if not rows:
        raise ConfigError("no cases", file=str(path), fix="add at least one line")
    return rows


def load_texts(path: str | Path | None = None) -> list[tuple[str, str]]:
    """(id, text) of the hard tokenizer texts (JSONL {"id", "text"}); texts must be non-empty."""
    file = Path(path) if path else TEXTS_FILE
    out = []
    for row in _jsonl(file, "text"):
        if not isinstance(row["text"], str) or not row["text"]:
            raise ConfigError(f"case '{row['id']}': text must be a non-empty string",
                              file=str(file), fix="an engine refuses an empty prompt")
        out.append((row["id"], row["text"]))
    return out


def load_conversations(path: str | Path | None = None) -> list[tuple[str, list[dict]]]:
    """(id, messages) of the bundled conversations (JSONL {"id", "messages"})."""
    file = Path(path) if path else CONVERSATIONS_FILE
    out = []
    for row in _jsonl(file, "messages"):
        messages = row["messages"]
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in messages)):
            raise ConfigError(f"conversation '{row['id']}': messages must be a non-empty list of "
                              "{role, content} with string content", file=str(file),
                              fix='e.g. [{"role": "user", "content": "Hi"}]')
        out.append((row["id"], messages))
    return out


def special_texts(tokenizer) -> list[tuple[str, str]]:
    """The checkpoint's own special-token strings as extra cases: each alone, all of them in a
    row, and each inside plain text (an engine that does not split them tokenizes them as text)."""
    tokens: list[str] = []
    for token in getattr(tokenizer, "all_special_tokens", None) or []:
        if isinstance(token, str) and token and token not in tokens:
            tokens.append(token)
    cases = [(f"special:{t}", t) for t in tokens]
    if tokens:
        cases.append(("special:all", "".join(tokens)))
        cases.append(("special:in-text", " ".join(f"before {t} after" for t in tokens)))
    return cases


# -- engine answers ------------------------------------------------------------------------
Step = tuple[int, dict[int, float]]


def _token_id(token) -> int | None:
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        try:
            return int(token[len(TOKEN_ID_PREFIX):])
        except ValueError:
            return None
    return None


def completion_steps(logprobs: Mapping | None) -> list[Step]:
    """Steps (chosen id, {id: logprob} of the top-k) of a completions `logprobs` object whose
    tokens are spelled 'token_id:N'; [] when absent or spelled as text."""
    if not isinstance(logprobs, Mapping):
        return []
    tokens = logprobs.get("tokens") or []
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    steps: list[Step] = []
    for token, top in zip(tokens, tops):
        chosen = _token_id(token)
        if chosen is None:
            return []
        ranked = {}
        for key, value in (top or {}).items():
            if (tid := _token_id(key)) is not None and isinstance(value, (int, float)):
                ranked[tid] = float(value)
        steps.append((chosen, ranked))
    return steps


def chat_steps(logprobs: Mapping | None) -> list[Step]:
    """The same for a chat `logprobs` object ({content: [{token, top_logprobs: [...]}]})."""
    if not isinstance(logprobs, Mapping):
        return []
    steps: list[Step] = []
    for entry in logprobs.get("content") or []:
        chosen = _token_id(entry.get("token")) if isinstance(entry, Mapping) else None
        if chosen is None:
            return []
        ranked = {}
        for top in entry.get("top_logprobs") or []:
            if isinstance(top, Mapping) and (tid := _token_id(top.get("token"))) is not None:
                ranked[tid] = float(top.get("logprob", float("-inf")))
        steps.append((chosen, ranked))
    return steps


def stop_string(text: str, skip: int = 1) -> str | None:
    """A one-character stop string that first occurs at index >= skip in text (so the stopped
    text is a non-empty prefix), not whitespace; None when text has none."""
    for index in range(skip, len(text)):
        char = text[index]
        if not char.isspace() and text.find(char) == index and char != "\ufffd":
            return char
    return None


__all__ = ["Mismatch", "first_difference", "compare_ids", "describe", "preview", "load_texts",
           "load_conversations", "special_texts", "short", "chat_ids", "completion_steps", "chat_steps",
           "stop_string", "TEXTS_FILE", "CONVERSATIONS_FILE", "Step"]
