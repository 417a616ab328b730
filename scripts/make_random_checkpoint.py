#!/usr/bin/env python
"""A checkpoint of any config.json with random bfloat16 weights, written shard by shard
(memory: one shard), for benchmarks at real sizes. Never committed.

    python scripts/make_random_checkpoint.py CONFIG_JSON OUT_FOLDER [--shard-gib 2]

Tensor names and shapes are those transformers' class for the config loads, in the Hugging
Face layout (MoE experts one tensor per expert and projection, as released checkpoints are).
Matrices are N(0, 0.02) (the configs' initializer_range), norm weights 1, biases 0. The
tokenizer is tiny-llama's (its ids are valid for any vocabulary of 512 or more). Seeded: the
same bytes on every machine with the same torch. An existing complete folder is kept.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOKENIZER_FROM = ROOT / "tests" / "fixtures" / "models" / "tiny-llama"
DONE = "day0-random-checkpoint.json"


def layout(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor a checkpoint of this config holds."""
    import torch

    from day0.checkpoint.modeling import build_meta_model, resolve_config

    model = build_meta_model(resolve_config(dict(config)), dtype=torch.bfloat16)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    out = []
    for name, tensor in model.state_dict().items():
        if tied and name.startswith("lm_head."):
            continue
        prefix, _, leaf = name.rpartition(".")
        if leaf == "gate_up_proj" and tensor.dim() == 3:  # fused experts: one tensor per expert
            experts, double, hidden = tensor.shape
            for j in range(experts):
                out += [(f"{prefix}.{j}.gate_proj.weight", (double // 2, hidden)),
                        (f"{prefix}.{j}.up_proj.weight", (double // 2, hidden))]
        elif leaf == "down_proj" and tensor.dim() == 3:
            for j in range(tensor.shape[0]):
                out.append((f"{prefix}.{j}.down_proj.weight", tuple(tensor.shape[1:])))
        else:
            out.append((name, tuple(tensor.shape)))
    return out


def _value(name: str, shape: tuple[int, ...], std: float):
    import torch

    if len(shape) == 1:
        fill = 0.0 if name.endswith(("bias", "e_score_correction_bias")) else 1.0
        return torch.full(shape, fill, dtype=torch.bfloat16)
    return torch.empty(shape, dtype=torch.bfloat16).normal_(0.0, std)


def make(config: Path | dict, folder: Path, shard_gib: float = 2.0) -> Path:
    """config: a config.json file or its dict."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    if (folder / DONE).is_file():
        return folder
    config = dict(config) if isinstance(config, dict) else json.loads(Path(config).read_text())
    config["torch_dtype"] = "bfloat16"
    tensors = layout(config)
    std = float(config.get("initializer_range", 0.02))
    torch.manual_seed(0)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    limit, shard, size, files, weight_map, total = shard_gib * 2**30, {}, 0, [], {}, 0
    started = time.monotonic()

    def flush():
        nonlocal shard, size
        if shard:
            name = f"part-{len(files):05d}.safetensors"
            save_file(shard, str(tmp / name), metadata={"format": "pt"})
            files.append((name, list(shard)))
            print(f"  wrote {name}: {size / 2**30:.2f} GiB, {time.monotonic() - started:.0f} s",
                  flush=True)
        shard, size = {}, 0

    for name, shape in tensors:
        value = _value(name, shape, std)
        if size and size + value.nbytes > limit:
            flush()
        shard[name] = value
        size += value.nbytes
        total += value.nbytes
    flush()
    for i, (part, names) in enumerate(files):
        final = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        (tmp / part).rename(tmp / final)
        weight_map.update({n: final for n in names})
    (tmp / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_FROM / file, tmp / file)
    (tmp / DONE).write_text(json.dumps({"bytes": total, "tensors": len(tensors),
                                        "seconds": round(time.monotonic() - started, 1)}))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="config.json of the model")
    parser.add_argument("out", type=Path, help="checkpoint folder to write")
    parser.add_argument("--shard-gib", type=float, default=2.0, help="shard size (default 2)")
    args = parser.parse_args()
    print(make(args.config, args.out, args.shard_gib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
