"""How much of a checkpoint the analysis reads, and how long it takes.

Run: ``.venv/bin/python bench/bench_analysis_bytes.py [--hidden 1024 --layers 4]``

Analyses (1) the committed fixture tests/fixtures/models/tiny-llama when it exists (else a tiny
Llama generated in a temp dir) and (2) a larger bf16 Llama generated in a temp dir, and prints
checkpoint size, bytes read (config + index + safetensors headers), their ratio, and wall time
of the header read and of the whole analysis stage (first run includes importing transformers).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIXTURE = ROOT / "tests" / "fixtures" / "models" / "tiny-llama"


def make_llama(folder: Path, *, hidden: int, layers: int, vocab: int, dtype: str, shard: str) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from day0.torchkit.dtypes import torch_dtype

    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 256), vocab_size=vocab,
                      intermediate_size=hidden * 3, dtype=dtype)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(cfg, dtype=torch_dtype(dtype))
    model.save_pretrained(folder, max_shard_size=shard)
    return folder


def measure(label: str, source: Path) -> dict:
    from day0.stages.analysis import core as analysis
    from day0.checkpoint.headers import read_checkpoint
    from day0.execution.contract import StageInputs
    from day0.execution.targets import resolve_target

    started = time.perf_counter()
    ckpt = read_checkpoint(source)
    header_s = time.perf_counter() - started
    started = time.perf_counter()
    result = analysis.run(analysis.Config(), StageInputs(source=str(source),
                                                          target=resolve_target("cpu-bf16")))
    stage_s = time.perf_counter() - started
    c = result.checkpoint
    row = {"checkpoint": label, "files": len(c.files), "tensors": c.tensors,
           "total_bytes": c.total_bytes, "bytes_read": c.bytes_read,
           "ratio": c.bytes_read / c.total_bytes, "headers_s": header_s, "analysis_s": stage_s,
           "params": result.params.total}
    assert ckpt.bytes_read == c.bytes_read
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size of the larger model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the larger model")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary of the larger model")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="day0-bench-") as tmp:
        tmp = Path(tmp)
        if (FIXTURE / "config.json").is_file():
            rows.append(measure("fixture tiny-llama", FIXTURE))
        else:
            small = make_llama(tmp / "tiny", hidden=64, layers=2, vocab=256, dtype="float32", shard="200KB")
            rows.append(measure("generated tiny-llama (fixture absent)", small))
        big = make_llama(tmp / "big", hidden=args.hidden, layers=args.layers, vocab=args.vocab,
                         dtype="bfloat16", shard="50MB")
        rows.append(measure(f"generated llama h{args.hidden} x{args.layers} bf16", big))
    print(f"{'checkpoint':42} {'files':>5} {'tensors':>7} {'size':>14} {'read':>9} "
          f"{'ratio':>9} {'headers':>8} {'analysis':>9}")
    for r in rows:
        print(f"{r['checkpoint']:42} {r['files']:>5} {r['tensors']:>7} {r['total_bytes']:>14,} "
              f"{r['bytes_read']:>9,} {r['ratio']:>9.2e} {r['headers_s'] * 1e3:>6.1f}ms "
              f"{r['analysis_s']:>8.2f}s")
    print("(transformers is imported while generating; times exclude that import)")
    print(f"refusal of num_hidden_layers=10**9 by a fresh `day0 analyze` (imports included): "
          f"{refusal_s():.2f} s")
    return 0


def refusal_s() -> float:
    """Wall time of a fresh process refusing an absurd config (the unbounded-work issue)."""
    import json
    import shutil
    import subprocess

    with tempfile.TemporaryDirectory(prefix="day0-bench-") as tmp:
        folder = Path(tmp) / "absurd"
        shutil.copytree(FIXTURE, folder)
        config = json.loads((folder / "config.json").read_text())
        config["num_hidden_layers"] = 10**9
        (folder / "config.json").write_text(json.dumps(config))
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "day0.cli", "analyze", str(folder)],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        elapsed = time.perf_counter() - started
    if proc.returncode != 2:
        raise SystemExit(f"expected exit 2, got {proc.returncode}: {proc.stderr[-500:]}")
    return elapsed


if __name__ == "__main__":
    raise SystemExit(main())
