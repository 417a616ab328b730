"""Evaluation text and tokens: which text, the tokenizer, seq_len windows and prompts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from day0 import DATA_DIR
from day0.errors import ConfigError, InputError

BUILTIN_TEXT = DATA_DIR / "eval_text.txt"
CHECKPOINT_TEXT = "heldout.txt"


def checkpoint_dir(source: str | Path) -> Path:
    path = Path(source)
    return path if path.is_dir() else path.parent


def resolve_text_file(text_file: str | None, source: str | Path) -> Path:
    """The configured file; else heldout.txt in the checkpoint folder; else the built-in text."""
    if text_file:
        path = Path(text_file).expanduser()
        if not path.is_file():
            raise ConfigError("evaluation text file not found", file=str(path), field="text_file",
                              fix="give an existing UTF-8 text file, or unset text_file to use "
                                  f"{CHECKPOINT_TEXT} in the checkpoint folder or the built-in text")
        return path
    candidate = checkpoint_dir(source) / CHECKPOINT_TEXT
    if candidate.is_symlink():
        from day0.store.links import refuse_escaping

        refuse_escaping(checkpoint_dir(source))  # heldout.txt -> /etc/passwd is never read
    return candidate if candidate.is_file() else BUILTIN_TEXT


def read_text(path: Path) -> str:
    from day0.checkpoint.limits import check_text_size

    check_text_size(path, "text_file", in_checkpoint=path.name == CHECKPOINT_TEXT)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text ({exc.reason})", file=str(path), field="text_file",
                          fix="give a UTF-8 text file") from None
    if not text.strip():
        raise ConfigError("evaluation text is empty", file=str(path), field="text_file",
                          fix="give a file with a few KB of representative text")
    return text


def chat_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The checkpoint's prompt ids of messages (generation prompt added; tools passed to a
    template that renders them), as a plain list."""
    extra = {"tools": tools} if tools else {}
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=False, **extra)
    if isinstance(out, Mapping):  # a transformers version that returns the encoding anyway
        out = out["input_ids"]
    return [int(i) for i in out]


def load_tokenizer(source: str | Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder = checkpoint_dir(source)
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many types for a missing/bad tokenizer
        raise InputError(f"cannot load the tokenizer: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}", file=str(folder),
                         fix="ship tokenizer.json (or the tokenizer files) with the checkpoint"
                         ) from None
    finally:
        hf_logging.set_verbosity(previous)


def tokenizer_problems(tokenizer, vocab_size: int | None) -> list[str]:
    """A checkpoint finding when the tokenizer has ids the model has no embedding row for
    (added tokens past vocab_size): a prompt holding one indexes past the embedding."""
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        return []
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: nothing to compare
        return []
    beyond = sorted(i for i in vocab.values() if isinstance(i, int) and i >= vocab_size)
    if not beyond:
        return []
    return [f"the tokenizer has {len(beyond)} token id(s) at or past the model's vocab_size "
            f"{vocab_size} (ids {beyond[0]}-{beyond[-1]}): a prompt holding one indexes past the "
            "embedding (fix: ship the tokenizer that belongs to these weights, or resize the "
            "embeddings and set vocab_size)"]


def tokenize(tokenizer, text: str, vocab_size: int | None = None) -> list[int]:
    """Token ids of the whole text, no special tokens added (windows are cut from it)."""
    # verbose=False: the whole text is longer than the context on purpose (it is cut later).
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        raise InputError(f"tokenizer produces id {max(ids)} >= the model's vocab_size "
                         f"{vocab_size}", field="vocab_size",
                         fix="the tokenizer does not belong to this checkpoint")
    return list(ids)


@dataclass
class Window:
    """One evaluation window: model input from position 0, the first positions context only."""

    ids: list[int] = field(repr=False)
    score_from: int = 0          # positions < score_from are context: computed, never scored
    text_offset: int = 0         # index of ids[prefix] in the tokenized text


def prefix_token(tokenizer) -> int | None:
    """The token a document starts with, as lm-eval's HF model chooses it: BOS, else EOS."""
    for attr in ("bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            return value
    return None


def windows(ids: list[int], seq_len: int, max_windows: int, prefix: int | None = None,
            context_tokens: int = 0) -> tuple[list[Window], list[str]]:
    """Consecutive non-overlapping windows of seq_len model positions over the text.

    Each window starts like a document (the prefix token when the tokenizer has one) so no
    scored position lacks the start-of-sequence anchor a model is trained with; the first
    context_tokens positions are context only, so every scored position has real text before it
    (a window cut mid-text otherwise turns its second token into an attention sink and scores
    nonsense there). A text shorter than one window is repeated to fill it (noted).
    """
    notes: list[str] = []
    if len(ids) < 2:
        raise ConfigError("evaluation text tokenizes to fewer than 2 tokens", field="text_file",
                          fix="give a longer text")
    head = [prefix] if prefix is not None else []
    body = seq_len - len(head)
    if body < 2:
        raise ConfigError(f"seq_len {seq_len} leaves no room for text", field="seq_len",
                          fix="use seq_len >= 3")
    score_from = min(max(context_tokens, len(head)), seq_len - 2)
    if len(ids) < body:
        repeats = -(-body // (len(ids) + len(head)))
        filled = (ids + head) * repeats
        notes.append(f"evaluation text has {len(ids)} tokens, fewer than one window of "
                     f"{seq_len}: it is repeated {repeats}x to reach the far positions "
                     "(give a longer text for an independent sample)")
        return [Window(head + filled[:body], score_from, 0)], notes
    count = min(max_windows, len(ids) // body)
    return [Window(head + ids[i * body:(i + 1) * body], score_from, i * body)
            for i in range(count)], notes


def prompts(ids: list[int], count: int, length: int) -> list[tuple[int, list[int]]]:
    """`count` (start offset, prompt) pairs of `length` tokens spread evenly over the text."""
    length = max(1, min(length, len(ids)))
    starts = max(1, len(ids) - length + 1)
    step = max(1, starts // max(count, 1))
    return [(s, ids[s:s + length]) for s in range(0, starts, step)][:count]
