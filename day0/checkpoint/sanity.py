"""Checkpoint sanity: is the checkpoint itself broken, whatever the target does with it?

Target and reference load the same bytes, so broken weights "run correctly" on every target.
These checks give such a checkpoint its own verdict, BROKEN (exit code 5); a stage reports what
it finds in ``StageResult.checkpoint_problems``. Three levels, thresholds in data/sanity.yaml:

* headers (analysis stage, no tensor data; day0.checkpoint.header_sanity, which imports no torch): most of
  the parameters unused by the model class (e.g. ``num_hidden_layers=0``), a floating-point
  parameter stored with an integer dtype;
* data (``check_weights``): every tensor streamed with ``safetensors.safe_open`` in bounded row
  slices: non-finite values, all-zero or constant matmul weights and embeddings, magnitudes only
  corruption produces, a shard whose tensors are all zero;
* behaviour (``perplexity_problems``): the reference perplexity near a uniform guess, or far above
  the score stored for the same model, revision and evaluation (``stored_reference_perplexity``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from day0.execution import progress
from day0.checkpoint.headers import read_checkpoint
from day0.errors import Problem
from day0.checkpoint.header_sanity import REEXPORT, _names, header_problems, limits  # noqa: F401


# --------------------------------------------------------------------------- tensor data

@dataclass
class _Stats:
    """What one pass over a tensor's values gives (min and max exact, in the stored dtype)."""

    numel: int = 0
    nonfinite: int = 0
    nonzero: bool = False
    lo: float = math.inf
    hi: float = -math.inf
    max_abs: float = 0.0
    percentile_abs: float = 0.0


class _Handle:
    """safe_open's get_tensor/get_slice over byte-range reads: a memory map would keep every
    page read resident (and counted in RSS) until the file closes."""

    def __init__(self, store):
        self.store = store

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.store.close()
        return False

    def get_tensor(self, name: str):
        return self.store.read(name)

    def get_slice(self, name: str):
        store, rows = self.store, self.store.shape(name)[0]

        class _Rows:
            def __getitem__(self, index: slice):
                return store.read(name, rows=(index.start, min(index.stop, rows)))
        return _Rows()


def _chunks(handle, name: str, shape: list[int]):
    """The tensor whole, or in row slices of at most chunk_elements (each reads only its bytes,
    so memory stays bounded on a huge embedding)."""
    lim = limits().weights
    if len(shape) == 0 or math.prod(shape) <= lim.chunk_elements:
        yield handle.get_tensor(name)
        return
    view = handle.get_slice(name)
    rows = max(1, lim.chunk_elements // max(math.prod(shape[1:]), 1))
    for start in range(0, shape[0], rows):
        yield view[start:start + rows]


def _tensor_stats(handle, name: str, shape: list[int], is_float: bool) -> _Stats:
    """One pass of aminmax per chunk (NaN propagates into it, so isfinite runs only on chunks
    that hold a non-finite value); a second pass for the percentile only when max |w| is already
    over the floor, which clean weights never are."""
    import torch

    lim = limits().weights
    stats = _Stats(numel=math.prod(shape))
    if not stats.numel:
        return stats
    for t in _chunks(handle, name, shape):
        if not is_float:
            stats.nonzero |= bool(t.ne(0).any())
            continue
        x = _values(t).reshape(-1)
        lo, hi = (float(v) for v in torch.aminmax(x))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            finite = torch.isfinite(x)
            stats.nonfinite += int(x.numel() - finite.sum())
            x = x[finite]
            if not x.numel():
                continue
            lo, hi = (float(v) for v in torch.aminmax(x))
        stats.lo, stats.hi = min(stats.lo, lo), max(stats.hi, hi)
    stats.max_abs = max(abs(stats.lo), abs(stats.hi)) if stats.lo <= stats.hi else 0.0
    stats.nonzero |= stats.max_abs > 0
    if stats.max_abs > lim.extreme_floor:
        stats.percentile_abs = _percentile_abs(handle, name, shape)
    return stats


def _values(t):
    """float8 has no CPU reductions: widen it (exactly) to float32; other floats stay as stored."""
    import torch

    return t.to(torch.float32) if t.element_size() == 1 else t


def _percentile_abs(handle, name: str, shape: list[int]) -> float:
    """The extreme_percentile of finite |w| over a strided sample, leaving at least
    percentile_min_above values above it (so one corrupt value in a small tensor cannot be its
    own yardstick)."""
    import torch

    lim = limits().weights
    step = max(1, math.prod(shape) // lim.sample_elements)
    parts = []
    for t in _chunks(handle, name, shape):
        x = _values(t).reshape(-1)[::step].to(torch.float32)
        parts.append(x[torch.isfinite(x)].abs())  # masking copies: the chunk itself is released
    values = torch.cat(parts)
    n = values.numel()
    k = min(math.ceil(lim.extreme_percentile * n), n - lim.percentile_min_above)
    return float(values.kthvalue(k).values) if k >= 1 else 0.0


def check_weights(source: str) -> list[str]:
    """Broken-checkpoint findings from every tensor's values, one line each (empty: none).

    source: a local checkpoint folder (the alignment stage passes its materialized copy). The
    files are exactly those day0.checkpoint.headers reads, so what is checked is what the stages load;
    a checkpoint whose structure is broken raises that CheckpointError instead.
    """
    from day0.torchkit.weights import WeightStore

    lim = limits().weights
    ckpt = read_checkpoint(source)
    store = WeightStore(source, tensors=ckpt.tensors)
    by_file: dict[str, list] = defaultdict(list)
    for info in ckpt.tensors.values():
        by_file[info.file].append(info)
    nonfinite: list[tuple[str, int]] = []
    zero, constant, extreme, zeroed_files = [], [], [], []
    total, checked = len(ckpt.tensors), 0
    for f, (file, infos) in enumerate(sorted(by_file.items())):
        infos.sort(key=lambda t: t.data_offsets)
        found: dict[str, _Stats] = {}
        with _Handle(store) as handle:
            for info in infos:
                progress.update("weights", checked, total,
                                detail=f"tensors checked, file {f + 1}/{len(by_file)}")
                found[info.name] = _tensor_stats(handle, info.name, list(info.shape),
                                                 info.dtype in lim.float_dtypes)
                checked += 1
        progress.update("weights", checked, total,
                        detail=f"tensors checked, file {f + 1}/{len(by_file)}")
        # zero biases are normal; a shard whose matmul weights and everything else are zero is not
        if (any(len(i.shape) >= 2 and not additive(i.name) for i in infos)
                and all(s.numel and not s.nonzero and not s.nonfinite for s in found.values())):
            zeroed_files.append((file, len(found)))
            continue  # one finding for the shard, not one per tensor
        for info in infos:
            s = found[info.name]
            if info.dtype not in lim.float_dtypes or not s.numel:
                continue
            if s.nonfinite:
                nonfinite.append((info.name, s.nonfinite))
            # matmul weights and embeddings must vary; norms (ones) and biases (zeros, whatever
            # their rank: a MoE's per-expert biases are 2-D) may not
            if len(info.shape) >= 2 and s.numel > 1 and not s.nonfinite and not additive(info.name):
                if not s.nonzero:
                    zero.append(info.name)
                elif s.lo == s.hi:
                    constant.append(info.name)
            if s.max_abs > lim.extreme_floor and s.max_abs > lim.extreme_ratio * s.percentile_abs:
                extreme.append((info.name, s.max_abs, s.percentile_abs))
    return _weight_messages(ckpt, nonfinite, zero, constant, extreme, zeroed_files)


ZERO = "weight tensor(s) are all zero"
CONSTANT = "weight tensor(s) hold one value repeated"


def means_untrained(problem: str) -> bool:
    """Whether a weight finding is what placeholder weights give by design: a model's own
    initialization zeroes or fills some matrices (afmoe's router gate starts at zero), so in
    bring-up all-zero or constant weights are notes; non-finite values, corrupt magnitudes and
    zeroed shards never are."""
    return ZERO in problem or CONSTANT in problem


def additive(name: str) -> bool:
    """Whether the tensor is added, not multiplied (a bias at any rank: data/sanity.yaml)."""
    leaf = name.rpartition(".")[2]
    return any(re.search(pattern, leaf) for pattern in limits().weights.additive)


def _weight_messages(ckpt, nonfinite, zero, constant, extreme, zeroed_files) -> list[str]:
    lim = limits().weights

    def where(names: list[str]) -> str:
        files = {ckpt.tensors[n].file for n in names}
        return ckpt.location(files.pop()) if len(files) == 1 else ckpt.source

    out = [str(Problem(f"every one of its {count} tensors is zero (the shard's data is zeroed)",
                       file=ckpt.location(file), fix=f"re-download {file}"))
           for file, count in zeroed_files]
    if nonfinite:
        names = [n for n, _ in nonfinite]
        out.append(str(Problem(
            f"{sum(c for _, c in nonfinite)} non-finite values (NaN/Inf) in {len(names)} "
            f"tensor(s): " + _names([f"{n} ({c})" for n, c in nonfinite]),
            file=where(names), fix=REEXPORT)))
    if zero:
        out.append(str(Problem(f"{len(zero)} {ZERO}: {_names(zero)}",
                               file=where(zero), fix=REEXPORT)))
    if constant:
        out.append(str(Problem(f"{len(constant)} {CONSTANT}: "
                               f"{_names(constant)}", file=where(constant), fix=REEXPORT)))
    if extreme:
        names = [n for n, _, _ in extreme]
        out.append(str(Problem(
            f"{len(extreme)} tensor(s) hold magnitudes only corruption produces (max |w| > "
            f"{lim.extreme_ratio:g} x its {lim.extreme_percentile * 100:g}th percentile |w|): "
            + _names([f"{n} (max {m:.3g} vs {p:.3g})" for n, m, p in extreme]),
            file=where(names), fix=REEXPORT)))
    return out


# --------------------------------------------------------------------------- perplexity

def untrained_findings(perplexity: float, vocab_size: int) -> list[str]:
    """What only says the weights are untrained: a finite reference perplexity near a uniform
    guess. BROKEN for a release; a note in bring-up (placeholder weights)."""
    lim = limits().perplexity
    if not (vocab_size and math.isfinite(perplexity)
            and perplexity / vocab_size > lim.max_uniform_ratio):
        return []
    return [f"the reference (cpu/float32) perplexity {perplexity:.4g} is "
            f"{perplexity / vocab_size:.2f} x the vocabulary size {vocab_size} (a uniform "
            f"guess scores 1.00 x): the weights do not model the text (fix: {REEXPORT})"]


def perplexity_problems(perplexity: float, vocab_size: int, stored: float | None, *,
                        untrained: bool = False) -> list[str]:
    """Broken-checkpoint findings from the reference (cpu/float32) perplexity: non-finite, near a
    uniform guess (uniform gives perplexity == vocab_size), or far above ``stored``, the score of
    the same model, revision and evaluation from an earlier run (None: no earlier run).
    untrained: the weights are placeholders (bring-up), so near-uniform is what they should
    give (:func:`untrained_findings`), not a problem; non-finite still is."""
    lim = limits().perplexity
    if not math.isfinite(perplexity):
        return [f"the reference (cpu/float32) perplexity is {perplexity}: the weights do not "
                f"compute a distribution (fix: {REEXPORT})"]
    out = [] if untrained else untrained_findings(perplexity, vocab_size)
    if stored and perplexity / stored > lim.max_stored_ratio:
        out.append(f"the reference (cpu/float32) perplexity {perplexity:.4g} is "
                   f"{perplexity / stored:.3f} x the score {stored:.4g} stored for this model and "
                   f"revision (limit {lim.max_stored_ratio:g} x): its weights changed since "
                   f"(fix: {REEXPORT} of this revision)")
    return out


def _score_path(model_key: str) -> Path:
    from day0.store.identity import cache_dir

    name = hashlib.sha256(model_key.encode()).hexdigest()  # any key is a safe file name
    return cache_dir() / "reference-scores" / f"{name}.json"


def stored_reference_perplexity(model_key: str) -> float | None:
    """The reference perplexity stored for model_key, or None (none stored, unreadable, or
    its seal does not verify: day0.store.seal; a forged score never judges a checkpoint)."""
    from day0.store import seal

    try:
        doc = json.loads(_score_path(model_key).read_text())
        trusted = doc.get("model_key") == model_key and seal.broken(doc) is None
        value = float(doc["perplexity"]) if trusted else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return value if value is not None and math.isfinite(value) and value > 0 else None


def store_reference_perplexity(model_key: str, value: float) -> None:
    """Store value for model_key, sealed, atomically (a reader sees the old file or the new
    one)."""
    from day0.store import seal

    path = _score_path(model_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".score-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(seal.seal({"model_key": model_key, "perplexity": float(value)}), fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["header_problems", "check_weights", "perplexity_problems",
           "stored_reference_perplexity", "store_reference_perplexity", "limits"]
