"""tokenizer.json's ids against the model's vocabulary, read as data (no tokenizer library).

A tokenizer whose ids reach past config.json's vocab_size (added tokens appended without
resizing the embeddings, the tokenizer of another model) hands the model ids it has no
embedding row for: a prompt holding one fails or reads another token's row. That is the
checkpoint's finding (BROKEN), found at analysis in well under a second. Checkpoints with only a
sentencepiece or tiktoken file are checked by alignment, which loads the tokenizer
(day0.torchkit.evaltext.tokenizer_problems).
"""

from __future__ import annotations

import json

NAME = "tokenizer.json"
MAX_BYTES = 256 << 20  # real ones are under 40 MB; past this the check is the loader's


def _ids(doc: dict) -> list[int]:
    ids: list[int] = []
    vocab = (doc.get("model") or {}).get("vocab") if isinstance(doc.get("model"), dict) else None
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        ids += [i for i in vocab.values() if isinstance(i, int)]
    elif isinstance(vocab, list):  # Unigram: [token, score] by id
        ids += range(len(vocab))
    for token in doc.get("added_tokens") or []:
        if isinstance(token, dict) and isinstance(token.get("id"), int):
            ids.append(token["id"])
    return ids


def problems(reader, vocab_size) -> list[str]:
    """One finding when tokenizer.json has ids at or past vocab_size, naming how many."""
    if not isinstance(vocab_size, int) or vocab_size <= 0 or NAME not in reader.names():
        return []
    size = reader.size(NAME)
    if size > MAX_BYTES:
        return []
    try:
        doc = json.loads(reader.read_range(NAME, 0, size))
    except (ValueError, OSError, RecursionError):
        return []  # not this check's finding: the loaders say so
    if not isinstance(doc, dict):
        return []
    beyond = sorted(i for i in _ids(doc) if i >= vocab_size)
    if not beyond:
        return []
    return [f"{NAME} has {len(beyond)} token id(s) at or past config.json's vocab_size "
            f"{vocab_size} (ids {beyond[0]}-{beyond[-1]}): a prompt holding one indexes past "
            "the embedding (fix: ship the tokenizer that belongs to these weights, or resize the "
            "embeddings and set vocab_size)"]


__all__ = ["problems"]
