"""Faulty copies of the tiny-llama fixture for negative controls of the engine stages: what a
checkpoint conversion can get wrong, served by a real engine while day0's reference reads the
original checkpoint.

* ``rope_fault``   - config conversion bug: the RoPE base (rope_theta) of another model family;
* ``weight_fault`` - weight conversion bug: one tensor of one layer scaled (e.g. a dropped or
  doubled scale factor in one projection);
* ``tokenizer_fault`` - tokenizer bug: the ids of BOS/EOS (and of 'e'/'t') swapped in
  tokenizer.json, the same strings mapping to other ids (a tokenizer from another release);
* ``defaults_fault`` - request-defaults bug: generation_config.json of the served copy sets a
  repetition_penalty, which vLLM applies to every request that does not set one (greedy too).

Both copy every file of the fixture (3.5 MB) into ``dst`` and change only what they say.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import MODELS

FIXTURE = MODELS / "tiny-llama"
INDEX = "model.safetensors.index.json"
# Llama-3's base where the fixture (like Llama-2) has 10000: at the fixture's 256 positions the
# middle RoPE frequencies rotate ~3x slower, so attention by relative position is off
ROPE_THETA = 500000.0
WEIGHT = "model.layers.1.self_attn.o_proj.weight"
WEIGHT_SCALE = 0.5


def copy_fixture(dst: Path, source: Path = FIXTURE) -> Path:
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file():
            shutil.copy2(item, dst / item.name)
    return dst


def rope_fault(dst: Path, theta: float = ROPE_THETA, source: Path = FIXTURE) -> Path:
    """A copy whose config.json has rope_theta = theta (wherever the config keeps it)."""
    folder = copy_fixture(dst, source)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    found = False
    for holder in (config, config.get("rope_parameters"), config.get("rope_scaling")):
        if isinstance(holder, dict) and "rope_theta" in holder:
            if holder["rope_theta"] == theta:
                raise ValueError(f"rope_theta is already {theta}: not a fault")
            holder["rope_theta"], found = theta, True
    if not found:
        raise ValueError(f"{path} has no rope_theta")
    path.write_text(json.dumps(config, indent=2))
    return folder


def weight_fault(dst: Path, tensor: str = WEIGHT, scale: float = WEIGHT_SCALE,
                 source: Path = FIXTURE) -> Path:
    """A copy whose `tensor` is multiplied by `scale` (same dtype, same shard, same names)."""
    from safetensors.torch import load_file, save_file

    folder = copy_fixture(dst, source)
    shard = folder / json.loads((folder / INDEX).read_text())["weight_map"][tensor]
    tensors = load_file(str(shard))
    original = tensors[tensor]
    tensors[tensor] = (original.double() * scale).to(original.dtype)
    if bool((tensors[tensor] == original).all()):
        raise ValueError(f"scaling {tensor} by {scale} changes nothing")
    save_file(tensors, str(shard), metadata={"format": "pt"})
    return folder


__all__ = ["rope_fault", "weight_fault", "tokenizer_fault", "defaults_fault", "copy_fixture",
           "ROPE_THETA", "WEIGHT", "WEIGHT_SCALE", "REPETITION_PENALTY"]


SWAPPED = ("<|bos|>", "<|eos|>", "e", "t")


def tokenizer_fault(dst: Path, swap: tuple[str, ...] = SWAPPED, source: Path = FIXTURE) -> Path:
    """A copy whose tokenizer.json swaps the ids of `swap`'s tokens pairwise (vocab and
    added_tokens): the same strings tokenize to other ids."""
    folder = copy_fixture(dst, source)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    for a, b in zip(swap[::2], swap[1::2]):
        vocab[a], vocab[b] = vocab[b], vocab[a]
    for added in data["added_tokens"]:
        added["id"] = vocab[added["content"]]
    data["added_tokens"].sort(key=lambda t: t["id"])
    path.write_text(json.dumps(data, ensure_ascii=False))
    return folder


REPETITION_PENALTY = 1.5


def defaults_fault(dst: Path, penalty: float = REPETITION_PENALTY, source: Path = FIXTURE) -> Path:
    """A copy whose generation_config.json sets repetition_penalty = penalty."""
    folder = copy_fixture(dst, source)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    if config.get("repetition_penalty") == penalty:
        raise ValueError(f"repetition_penalty is already {penalty}: not a fault")
    config["repetition_penalty"] = penalty
    path.write_text(json.dumps(config, indent=2))
    return folder
