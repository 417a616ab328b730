#!/usr/bin/env python
"""A checkpoint for performance measurements on CPU engines (random weights; never committed).

    python scripts/make_perf_model.py OUT_FOLDER

tiny-llama decodes a step in well under a millisecond: on a 2-core machine vLLM's API server,
not the model, is then the bottleneck, streamed tokens arrive in bursts and latencies measure
CPU scheduling (bench/calibrate_performance.py showed clean repeats as slow as a serialized
engine). This Llama (hidden 768, 6 layers, 37 M parameters, bf16 74 MB) takes ~10 ms a decode
step, like a real model's engine-bound serving; it keeps tiny-llama's tokenizer and a context of
512. Seeded: the same bytes on every machine with the same torch.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FROM = ROOT / "tests" / "fixtures" / "models" / "tiny-llama"
SHAPE = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
             num_attention_heads=12, num_key_value_heads=3, head_dim=64,
             max_position_embeddings=512, vocab_size=512, bos_token_id=0, eos_token_id=1,
             pad_token_id=2, tie_word_embeddings=False)


def make(folder: Path) -> Path:
    """Write the checkpoint into folder (kept when already complete)."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE)).to(torch.bfloat16)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_FROM / name, tmp / name)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(make(Path(sys.argv[1])))
