"""Byte-exact ways to break a copy of a checkpoint (the broken-weights cases of issue 8).

Every edit works on the safetensors bytes in place: same file sizes, headers rewritten only
where the case needs it (dtype relabel), so what breaks is exactly what the case says.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import struct
from pathlib import Path

from tests.conftest import MODELS

INDEX = "model.safetensors.index.json"


def copy_fixture(dest: Path, model: str = "tiny-llama") -> Path:
    return Path(shutil.copytree(MODELS / model, dest))


def shards(folder: Path) -> list[Path]:
    return sorted(folder / s for s in set(json.loads((folder / INDEX).read_text())["weight_map"].values()))


def header_of(path: Path) -> tuple[dict, int]:
    """(header, offset of the data section) of a safetensors file."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n)), 8 + n


def span(folder: Path, tensor: str) -> tuple[Path, int, int, dict]:
    """(shard, absolute begin, absolute end, header entry) of a tensor's data."""
    shard = folder / json.loads((folder / INDEX).read_text())["weight_map"][tensor]
    header, data = header_of(shard)
    begin, end = header[tensor]["data_offsets"]
    return shard, data + begin, data + end, header[tensor]


@contextlib.contextmanager
def keep_mtime(path: Path):
    """Whatever is written inside, path's atime and mtime (ns) are restored after."""
    stat = path.stat()
    try:
        yield
    finally:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def write_at(path: Path, offset: int, data: bytes) -> None:
    with keep_mtime(path), open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def put_float(folder: Path, tensor: str, index: int, value: float) -> None:
    """Set element `index` (flat) of a float32 tensor to value."""
    shard, begin, end, entry = span(folder, tensor)
    assert entry["dtype"] == "F32" and begin + 4 * index < end
    write_at(shard, begin + 4 * index, struct.pack("<f", value))


def read_float(folder: Path, tensor: str, index: int) -> float:
    shard, begin, _, entry = span(folder, tensor)
    assert entry["dtype"] == "F32"
    with open(shard, "rb") as fh:
        fh.seek(begin + 4 * index)
        return struct.unpack("<f", fh.read(4))[0]


def zero_shard_data(shard: Path) -> None:
    """Same header, every data byte zero."""
    _, data = header_of(shard)
    write_at(shard, data, bytes(shard.stat().st_size - data))


def flip_bytes(folder: Path, count: int = 64, seed: int = 0) -> list[tuple[str, int]]:
    """XOR `count` seeded random bytes of the data sections (never a header) with a random
    non-zero byte; returns (shard name, offset) of each."""
    rng = random.Random(seed)
    areas = [(s, header_of(s)[1], s.stat().st_size) for s in shards(folder)]
    total = sum(end - begin for _, begin, end in areas)
    flipped = []
    for pos in sorted(rng.sample(range(total), count)):
        for shard, begin, end in areas:
            if pos < end - begin:
                with open(shard, "rb") as fh:
                    fh.seek(begin + pos)
                    old = fh.read(1)[0]
                write_at(shard, begin + pos, bytes([old ^ rng.randrange(1, 256)]))
                flipped.append((shard.name, begin + pos))
                break
            pos -= end - begin
    return flipped


def swap_tensors(folder: Path, a: str, b: str) -> None:
    """Exchange the data of two tensors of the same dtype and shape, in place."""
    (sa, ba, ea, ia), (sb, bb, eb, ib) = span(folder, a), span(folder, b)
    assert (ia["dtype"], ia["shape"]) == (ib["dtype"], ib["shape"])
    data_a, data_b = sa.read_bytes()[ba:ea], sb.read_bytes()[bb:eb]
    write_at(sa, ba, data_b)
    write_at(sb, bb, data_a)


def relabel_dtype(folder: Path, tensor: str, dtype: str = "I32") -> None:
    """Rewrite the header with the tensor's dtype changed (same element size: the data section
    and every offset stay valid; the header length is recomputed)."""
    shard = span(folder, tensor)[0]
    header, data = header_of(shard)
    raw = shard.read_bytes()
    header[tensor]["dtype"] = dtype
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    shard.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[data:])


def add_zero_single_file(folder: Path) -> Path:
    """A stray single-file model.safetensors of zeros with every tensor of the checkpoint."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = {}
    for shard in shards(folder):
        tensors.update({k: torch.zeros_like(v) for k, v in load_file(shard).items()})
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder / "model.safetensors"


def edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
