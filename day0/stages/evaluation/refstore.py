"""Stored reference results: the reference side's per-item lm-eval outputs, kept so that a
re-validation (another target, the same target later) does not recompute them.

Keyed by everything that decides them: the weights digest, each task's digest, lm-eval's
version, the reference's device and dtype, n-shot, limit, seed, the long-context size. Stored
under the results location when one is set (<results>/<model>/<revision>/reference-<device>-
<dtype>/evaluation/<key>.json, object store or folder), else under day0's cache dir; a
configured reference_store wins."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from day0.store import identity, s3, seal
from day0.atomic import write_atomic
from day0.stages.evaluation.config import Config
from day0.execution.targets import Target

FORMAT = 3  # 3: sealed (day0.store.seal)


def key(*, weights: str, tasks: list, reference: Target, config: Config, lm_eval_version: str,
        long_context_tokens: int) -> str:
    parts = {"format": FORMAT, "weights": weights, "lm_eval": lm_eval_version,
             "tasks": [(t.name, t.digest) for t in tasks],
             "reference": [reference.device, reference.dtype, list(reference.plugins)],
             "num_fewshot": config.num_fewshot, "limit": config.limit, "seed": config.seed,
             "long_context": [config.long_context_items, long_context_tokens],
             "max_gen_toks": config.max_gen_toks, "batch_size": config.batch_size,
             "share_context": config.share_context,
             "share_from": shared_from(config),
             "sandbox_limits": config.sandbox_limits.model_dump()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def shared_from(config: Config) -> int | None:
    """The shortest context that runs once per item (day0.stages.evaluation.prefix); None:
    every request runs whole."""
    return 2 if config.share_context else config.share_context_from_tokens


def location(config: Config, source: str, revision: str | None, reference: Target,
             weights: str) -> str:
    """Folder (ends in '/') or s3:// prefix where this checkpoint's reference results live."""
    if config.reference_store:
        return config.reference_store.rstrip("/") + "/"
    side = f"reference-{reference.device}-{reference.dtype}"
    folder = identity.results_location(None, source, side, revision, weights=weights)
    if folder is not None:
        return folder + "evaluation/"
    return str(identity.cache_dir() / "evaluation-reference") + "/"


def load(where: str, name: str, notes: list[str] | None = None) -> dict | None:
    """The stored results when their seal verifies (day0.store.seal), or None: none stored,
    unreadable, or not trusted (said in notes): recomputed. A store that cannot answer is asked
    again (day0.store.retry); one that stays down is StoreDown, the stage's ERROR."""
    from day0.store.retry import read_optional

    uri = where + f"{name}.json"
    try:
        raw = read_optional(uri) if s3.is_s3(where) else Path(uri).read_bytes()
        if raw is None:
            return None
        data = json.loads(raw)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    if why := seal.broken(data):
        if notes is not None:
            notes.append(f"stored reference results {uri} not replayed: {why}; recomputed")
        return None
    return data


def save(where: str, name: str, data: dict) -> str:
    uri = where + f"{name}.json"
    raw = json.dumps(seal.seal({"format": FORMAT, **data})).encode()
    if s3.is_s3(where):
        s3.put_object(uri, raw)
    else:
        write_atomic(uri, raw)
    return uri
