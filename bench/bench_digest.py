"""What the weights digest of the stage cache costs on a 1 GB checkpoint.

Run: ``.venv/bin/python bench/bench_digest.py [--gb 1.0]``

Writes a checkpoint of random float32 data in a temp dir (4 safetensors shards + index +
config.json; deleted afterwards, never committed) and prints, side by side, seconds and GB/s of:

* the old digest: sha256 of every file memoised by (path, size, mtime) - its first run, and its
  repeat (a memo hit, which is what let an in-place edit with the mtime restored go stale);
* day0.store.identity.weights_digest now: xxh3-128 of every byte on every run, cold and warm page cache;
* plain sha256 of every byte, cold and warm, for scale;
* the digest again with a 32 GiB sparse notes.md beside the weights: a file no loader reads is
  listed by name and size, never read (day0/data/digest.yaml), so it costs nothing.

"Cold": each file's pages are dropped from the page cache first (fsync + POSIX_FADV_DONTNEED, no
root needed), so the figure includes reading the disk. Figures only, no asserts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARDS = 4


def make_checkpoint(folder: Path, total_bytes: int) -> None:
    per_shard = total_bytes // SHARDS // 4 * 4
    weight_map = {}
    for i in range(SHARDS):
        name = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        tensor = f"model.layers.{i}.mlp.down_proj.weight"
        header = json.dumps({tensor: {"dtype": "F32", "shape": [per_shard // 4],
                                      "data_offsets": [0, per_shard]}}).encode()
        with open(folder / name, "wb") as fh:
            fh.write(struct.pack("<Q", len(header)) + header)
            for _ in range(per_shard // (64 << 20)):
                fh.write(os.urandom(64 << 20))
            fh.write(os.urandom(per_shard % (64 << 20)))
        weight_map[tensor] = name
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))


def drop_page_cache(folder: Path) -> None:
    for f in folder.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def old_memo_digest(folder: Path, memo_dir: Path) -> str:
    """The digest before content keys: per-file sha256 memoised by (path, size, mtime)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = f.stat()
        key = hashlib.sha256(f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
        memo = memo_dir / key
        if memo.is_file():
            digest = memo.read_text()
        else:
            digest = sha256_file(f)
            memo_dir.mkdir(parents=True, exist_ok=True)
            memo.write_text(digest)
        h.update(f"{f.relative_to(folder)}:{digest}\n".encode())
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def timed(label: str, fn, size: int, rows: list) -> None:
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    rows.append((label, seconds, size / seconds / 1e9))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="checkpoint size in GB (default 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="day0-bench-digest-") as tmp:
        folder, cache = Path(tmp) / "ckpt", Path(tmp) / "cache"
        folder.mkdir()
        os.environ["DAY0_CACHE_DIR"] = str(cache)
        from day0.store.identity import weights_digest

        make_checkpoint(folder, int(args.gb * 1e9))
        size = sum(f.stat().st_size for f in folder.iterdir())
        shas = lambda: [sha256_file(f) for f in sorted(folder.iterdir())]  # noqa: E731
        rows: list = []
        drop_page_cache(folder)
        timed("old: sha256 + (path,size,mtime) memo, first run, cold",
              lambda: old_memo_digest(folder, cache / "digests"), size, rows)
        timed("old: memo hit (repeat; blind to in-place edits)",
              lambda: old_memo_digest(folder, cache / "digests"), size, rows)
        drop_page_cache(folder)
        timed("new: weights_digest xxh3-128 every run, cold", lambda: weights_digest(str(folder)),
              size, rows)
        timed("new: weights_digest xxh3-128 every run, warm", lambda: weights_digest(str(folder)),
              size, rows)
        drop_page_cache(folder)
        timed("sha256 of every byte, cold", shas, size, rows)
        timed("sha256 of every byte, warm", shas, size, rows)
        with open(folder / "notes.md", "wb") as fh:  # sparse: nothing on disk
            fh.truncate(32 << 30)
        timed("new + a 32 GiB notes.md beside (listed, not read), warm",
              lambda: weights_digest(str(folder)), size, rows)
    print(f"checkpoint: {size / 1e9:.3f} GB in {SHARDS} shards + index + config")
    width = max(len(r[0]) for r in rows)
    print(f"{'digest':<{width}}  {'seconds':>8}  {'GB/s':>7}")
    for label, seconds, rate in rows:
        print(f"{label:<{width}}  {seconds:>8.3f}  {rate:>7.2f}")


if __name__ == "__main__":
    main()
