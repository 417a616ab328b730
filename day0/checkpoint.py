"""Read a checkpoint from config.json and safetensors *headers* only; never tensor data.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header
(``{name: {dtype, shape, data_offsets}}``), then the packed data. Reading 8 + N bytes per shard
gives every tensor's name, dtype, shape and position, so a 1 TB checkpoint is checked by reading
a few megabytes (``Checkpoint.bytes_read`` counts every byte read).

Files are reached through a tiny :class:`Reader` (``names``/``size``/``read_range``);
``open_reader(source)`` picks the implementation: a local folder, or an s3:// prefix read with
ranged GETs (day0.storage.S3Reader).

Every problem found is collected and raised together as one :class:`CheckpointError`:
truncated shards, bad header lengths or offsets, non-JSON headers, index/shard disagreements,
unknown dtypes, and tensor shapes that disagree with what transformers builds from config.json
(compared against the meta model after transformers' own checkpoint-name conversions; see
day0.checkpoint_match).
Things that load but deserve a look (extra tensors such as MTP layers, dtype surprises) become
:class:`Note` s instead.
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import yaml

from day0.errors import CheckpointError, InputError, Problem
from day0.limits import size_problems, stored_bytes

DATA_FILE = Path(__file__).parent / "data" / "analysis.yaml"
REDOWNLOAD = "re-download or re-export this shard"


@lru_cache(maxsize=1)
def data() -> dict:
    """day0/data/analysis.yaml (dtype sizes, name patterns, risk texts)."""
    return yaml.safe_load(DATA_FILE.read_text(encoding="utf-8"))


def risk_text(risk_id: str, **fields) -> tuple[str, str]:
    """(severity, message) of a risk from the YAML checklist, filled with fields."""
    spec = data()["risks"][risk_id]
    return spec["severity"], spec["message"].format(**fields)


# --------------------------------------------------------------------------- readers

class Reader(Protocol):
    """File access behind the checks: a flat set of named files with ranged reads."""

    def names(self) -> list[str]: ...
    def size(self, name: str) -> int: ...
    def read_range(self, name: str, start: int, length: int) -> bytes: ...
    def location(self, name: str) -> str: ...


class LocalReader:
    """A local checkpoint folder, or a lone config.json file (which means: no weights)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if path.is_dir():
            self._files = {p.name: p for p in path.iterdir() if p.is_file()}
        elif path.is_file():
            self._files = {data()["files"]["config"]: path}
        else:
            raise InputError("no such file or folder", file=str(path),
                             fix="pass a checkpoint folder or a config.json")
        self.path = path

    def names(self) -> list[str]:
        return sorted(self._files)

    def size(self, name: str) -> int:
        return self._files[name].stat().st_size

    def read_range(self, name: str, start: int, length: int) -> bytes:
        with open(self._files[name], "rb") as fh:
            fh.seek(start)
            return fh.read(length)

    def location(self, name: str) -> str:
        return str(self._files.get(name, self.path / name))


class CountingReader:
    """Wraps any Reader and counts the bytes it returned (the benchmark's numerator)."""

    def __init__(self, inner: Reader):
        self.inner = inner
        self.bytes_read = 0

    def names(self) -> list[str]:
        return self.inner.names()

    def size(self, name: str) -> int:
        return self.inner.size(name)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        chunk = self.inner.read_range(name, start, length)
        self.bytes_read += len(chunk)
        return chunk

    def location(self, name: str) -> str:
        return self.inner.location(name)


def open_reader(source: str | Path) -> Reader:
    """The Reader for a source: a local folder or config.json, or an s3:// prefix."""
    if str(source).startswith("s3://"):
        from day0.storage import S3Reader

        return S3Reader(str(source))
    if str(source).startswith(("gs://", "http://", "https://")):
        raise InputError("only local paths and s3:// URIs are supported", file=str(source),
                         fix="copy the checkpoint to an S3-compatible bucket or a local folder")
    return LocalReader(source)


# --------------------------------------------------------------------------- results

@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its safetensors header describes it."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]


@dataclass(frozen=True)
class Note:
    """Something that loads but deserves a look; becomes a risk in the analysis."""

    id: str
    severity: str
    message: str
    file: str | None = None
    tensor: str | None = None


@dataclass
class Checkpoint:
    """config.json + every tensor header of a checkpoint, and how much was read to get them."""

    source: str
    config: dict
    config_file: str
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)  # file name -> size in bytes
    locations: dict[str, str] = field(default_factory=dict)  # file name -> path/URL for messages
    index_file: str | None = None
    bytes_read: int = 0
    notes: list[Note] = field(default_factory=list)
    # tensor name -> "model" (loaded into a parameter), "buffer" (persistent buffer),
    # "quant" (quantization scales etc.) or "extra" (not used by transformers' class)
    roles: dict[str, str] = field(default_factory=dict)
    model_class: str | None = None

    def location(self, name: str | None) -> str | None:
        return self.locations.get(name, name) if name else None

    @property
    def has_weights(self) -> bool:
        return bool(self.tensors)

    @property
    def total_bytes(self) -> int:
        """Size of every checkpoint file looked at (config, index, shards)."""
        return sum(self.files.values())

    def params(self, role: str = "model") -> int:
        return sum(t.numel for n, t in self.tensors.items() if self.roles.get(n, "model") == role)

    def summary(self) -> dict:
        dtypes = Counter(t.dtype for t in self.tensors.values())
        return {"has_weights": self.has_weights, "files": sorted(self.files),
                "index_file": self.index_file, "tensors": len(self.tensors),
                "dtypes": dict(sorted(dtypes.items())), "total_bytes": self.total_bytes,
                "bytes_read": self.bytes_read,
                "bytes_read_ratio": (self.bytes_read / self.total_bytes
                                     if self.has_weights and self.total_bytes else None),
                "notes": [n.message for n in self.notes]}


# --------------------------------------------------------------------------- reading

def read_checkpoint(source: str | Path | Reader, *, model=None, check_config: bool = True,
                    trust_remote_code: bool = False) -> Checkpoint:
    """Read and cross-check a checkpoint; raise one CheckpointError listing every problem.

    ``model``: the meta model of this config, or a callable ``(config_dict, config_file) -> meta
    model`` (called only when there are weights to compare); default: built with day0.modeling. With
    ``check_config`` and weights present, names and shapes are compared against it.
    """
    reader = CountingReader(source if hasattr(source, "read_range") else open_reader(source))
    config, config_file = _read_config(reader)
    ckpt = Checkpoint(source=str(getattr(reader.inner, "path", source)), config=config,
                      config_file=config_file)
    _add_file(reader, ckpt, data()["files"]["config"])
    from day0.checkpoint_match import check_dtypes, match_model  # it builds on this module

    problems: list[Problem] = []
    shards_ok = _read_weights(reader, ckpt, problems)
    inflated = size_problems(config, config_file, stored_bytes(reader), ckpt.source)
    if inflated:  # a config far bigger than its weights: do not build that model
        raise CheckpointError.from_problems(problems + inflated)
    if ckpt.tensors:
        check_dtypes(ckpt)
        if check_config:
            if model is None:
                from day0.modeling import build_meta_model, resolve_config

                model = build_meta_model(resolve_config(config, trust_remote_code=trust_remote_code,
                                                        file=config_file))
            elif callable(model) and not hasattr(model, "state_dict"):
                model = model(config, config_file)
            match_model(ckpt, model, problems, check_missing=shards_ok)
    # an object store reader counts what went over the wire (speculative header reads included)
    ckpt.bytes_read = getattr(reader.inner, "bytes_fetched", reader.bytes_read)
    if problems:
        raise CheckpointError.from_problems(problems)
    return ckpt


def _read_config(reader: CountingReader) -> tuple[dict, str]:
    name = data()["files"]["config"]
    where = reader.location(name)
    if name not in reader.names():
        raise InputError("no config.json found", file=where,
                         fix="pass a checkpoint folder containing config.json, or a config.json file")
    from day0.limits import check_config, check_config_size
    from day0.modeling import parse_config_json

    check_config_size(reader.size(name), where)  # before reading: it may be any size
    config = parse_config_json(reader.read_range(name, 0, reader.size(name)), where)
    check_config(config, where)  # refused before a single header is read or anything is built
    return config, where


def _read_weights(reader: CountingReader, ckpt: Checkpoint, problems: list[Problem]) -> bool:
    """Fill ckpt.tensors from the index and shards; False when a shard could not be read."""
    files = data()["files"]
    names = reader.names()
    shards = [n for n in names if n.endswith(".safetensors")]
    if files["index"] in names:
        return _read_indexed(reader, ckpt, problems, shards)
    if not shards:
        others = [n for n in names if n in files["other_weights"] or n.endswith((".bin", ".pt", ".pth"))]
        if others:
            problems.append(Problem(f"weights in {others} but no safetensors", file=reader.location(others[0]),
                                    fix="convert the checkpoint to safetensors (day0 reads headers only)"))
        return not others
    if shards != [files["single"]]:
        problems.append(Problem(f"{len(shards)} safetensors files but no {files['index']}",
                                file=reader.location(files["index"]),
                                fix=f"restore {files['index']} (transformers needs it to find the shards)"
                                if len(shards) > 1 else f"rename the file to {files['single']}"))
    ok = True
    for shard in shards:
        ok &= _add_shard(reader, ckpt, shard, problems)
    return ok


def _read_indexed(reader, ckpt: Checkpoint, problems: list[Problem], shards: list[str]) -> bool:
    index = data()["files"]["index"]
    where = reader.location(index)
    ckpt.index_file = index
    _add_file(reader, ckpt, index)
    try:
        if reader.size(index) > data()["max_header_bytes"]:  # not read into memory at all
            raise ValueError(f"{reader.size(index)} bytes, over {data()['max_header_bytes']}")
        doc = json.loads(reader.read_range(index, 0, reader.size(index)).decode("utf-8"))
        weight_map = doc["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map must map tensor names to shard file names")
        if not weight_map:  # transformers would load nothing and initialise every weight at random
            raise ValueError("weight_map is empty")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as exc:
        problems.append(Problem(f"index unreadable: {type(exc).__name__}: {exc}", file=where,
                                field="weight_map", fix=f"restore {index} from the model's release"))
        return False
    by_shard: dict[str, list[str]] = defaultdict(list)
    for tensor, shard in weight_map.items():
        by_shard[shard].append(tensor)
    ok = True
    for shard, listed in sorted(by_shard.items()):
        if shard not in reader.names():
            problems.append(Problem(f"shard named by {index} for {len(listed)} tensors is missing",
                                    file=reader.location(shard), field=sorted(listed)[0],
                                    fix="download the missing shard"))
            ok = False
            continue
        before = set(ckpt.tensors)
        if not _add_shard(reader, ckpt, shard, problems):
            ok = False  # its header is unusable: that one problem covers every tensor listed
            continue
        found = set(ckpt.tensors) - before
        shard_where = reader.location(shard)  # once: an index may list 100,000 names
        for tensor in sorted(set(listed) - found):
            if tensor in ckpt.tensors:  # a header of another shard has it
                continue
            problems.append(Problem(f"listed in {index} but not in this shard's header",
                                    file=shard_where, field=tensor, fix=REDOWNLOAD))
    for tensor, info in sorted(ckpt.tensors.items()):
        mapped = weight_map.get(tensor)
        if mapped != info.file:
            problems.append(Problem(
                f"in this shard's header but {index} " +
                (f"maps it to {mapped}" if mapped else "does not list it"),
                file=ckpt.location(info.file), field=tensor,
                fix=f"regenerate {index} from the shards' headers"))
    problems.extend(single_file_problems(reader, set(by_shard)))
    unnamed = sorted(set(shards) - set(by_shard) - {data()["files"]["single"]})
    if unnamed:  # e.g. Mistral's consolidated.safetensors next to the HF shards
        ckpt.notes.append(Note("checkpoint_note", "warning",
                               f"safetensors files not named by {index} are not loaded by "
                               f"transformers nor checked: {unnamed}"))
    return ok


def single_file_problems(reader: Reader, named: set[str]) -> list[Problem]:
    """One loader truth: transformers loads model.safetensors whenever it exists, even next to an
    index naming other shards, so such a folder would run other weights than the index says."""
    index, single = data()["files"]["index"], data()["files"]["single"]
    if single not in reader.names() or named <= {single}:
        return []
    return [Problem(f"{single} lies next to {index}, which does not name it alone: transformers "
                    f"would load {single} instead of the shards the index names",
                    file=reader.location(single), fix=f"remove {single} or {index}")]


def check_loader_files(source: str | Path) -> None:
    """Raise CheckpointError when transformers would load other files than the index names
    (see single_file_problems); the loader calls this so stages load what analysis read."""
    reader = open_reader(source)
    index = data()["files"]["index"]
    if index not in reader.names():
        return
    try:
        named = set(json.loads(reader.read_range(index, 0, reader.size(index)))["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return  # an unreadable index is reported by analysis and by transformers itself
    problems = single_file_problems(reader, named)
    if problems:
        raise CheckpointError.from_problems(problems)


def _add_file(reader, ckpt: Checkpoint, name: str) -> None:
    ckpt.files[name] = reader.size(name)
    ckpt.locations[name] = reader.location(name)


def _add_shard(reader, ckpt: Checkpoint, shard: str, problems: list[Problem]) -> bool:
    found = read_header(reader, shard, problems)
    if found is None:
        return False
    _add_file(reader, ckpt, shard)
    for name, info in found.items():
        if name in ckpt.tensors:
            problems.append(Problem(f"tensor also in {ckpt.tensors[name].file}",
                                    file=reader.location(shard), field=name,
                                    fix="keep each tensor in exactly one shard"))
            continue
        ckpt.tensors[name] = info
    return True


def read_header(reader, shard: str, problems: list[Problem]) -> dict[str, TensorInfo] | None:
    """One shard's tensors from its header, or None when the header itself is unusable.

    Layout problems (offsets out of range, overlaps, gaps, truncation) are appended to
    problems; the tensors are still returned so the other checks can run on them.
    """
    where = reader.location(shard)
    size = reader.size(shard)
    if size < 8:
        problems.append(Problem(f"file is {size} bytes, shorter than the 8-byte header length",
                                file=where, fix=REDOWNLOAD))
        return None
    (length,) = struct.unpack("<Q", reader.read_range(shard, 0, 8))
    limit = data()["max_header_bytes"]
    if length > size - 8 or length > limit:
        problems.append(Problem(
            f"header length {length} runs past the end of the file ({size} bytes)"
            if length > size - 8 else f"header length {length} exceeds safetensors' limit {limit}",
            file=where, fix=REDOWNLOAD + " (truncated or not a safetensors file)"))
        return None
    try:
        header = json.loads(reader.read_range(shard, 8, length).decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        problems.append(Problem(f"header is not valid JSON ({type(exc).__name__}: {exc})",
                                file=where, fix=REDOWNLOAD))
        return None
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict)
                                 and all(isinstance(v, str) for v in meta.values())):
        # safetensors' loader accepts only a map of strings to strings: transformers could not load it
        problems.append(Problem("__metadata__ is not a JSON object of strings", file=where,
                                field="__metadata__", fix=REDOWNLOAD))
    bits = data()["safetensors_dtypes"]
    tensors: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        info = _tensor_info(name, meta, shard, where, bits, problems)
        if info is not None:
            tensors[name] = info
    _check_layout(tensors, size - 8 - length, where, bits, problems)
    return tensors


def _tensor_info(name, meta, shard, where, bits, problems) -> TensorInfo | None:
    try:
        dtype, shape, offsets = meta["dtype"], meta["shape"], meta["data_offsets"]
        if not isinstance(dtype, str):
            raise ValueError(f"dtype {dtype!r} is not a string")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end")
    except (TypeError, KeyError, ValueError) as exc:
        problems.append(Problem(f"malformed header entry: {exc}", file=where, field=name, fix=REDOWNLOAD))
        return None
    if dtype not in bits:
        problems.append(Problem(f"unknown safetensors dtype '{dtype}'", file=where, field=name,
                                fix=f"re-export with one of {', '.join(bits)}"))
        return None
    info = TensorInfo(name, shard, dtype, tuple(shape), (offsets[0], offsets[1]))
    need = _need(info, bits)
    if info.nbytes != need:
        problems.append(Problem(f"data_offsets span {info.nbytes} bytes but {dtype}{list(shape)} "
                                f"needs {need}", file=where, field=name, fix=REDOWNLOAD))
    return info


def _need(info: TensorInfo, bits: dict) -> int:
    return -(-info.numel * bits[info.dtype] // 8)  # integers: a hostile shape overflows floats


def _check_layout(tensors: dict[str, TensorInfo], data_len: int, where: str, bits: dict,
                  problems: list[Problem]) -> None:
    """Tensors must tile the data section exactly, as safetensors itself requires on load.

    An entry whose span disagrees with its shape is already reported; it is left out of the
    tiling check so one corrupt entry does not also show up as overlaps with all the others."""
    pos, prev = 0, None
    sound = [t for t in tensors.values() if t.nbytes == _need(t, bits)]
    for info in sorted(sound, key=lambda t: t.data_offsets):
        begin, end = info.data_offsets
        if begin < pos:
            problems.append(Problem(f"data_offsets {list(info.data_offsets)} overlap {prev}",
                                    file=where, field=info.name, fix=REDOWNLOAD))
        elif begin > pos and len(sound) == len(tensors):  # else the gap is the bad entry's slot
            problems.append(Problem(f"{begin - pos} unaccounted bytes before this tensor's data",
                                    file=where, field=info.name, fix=REDOWNLOAD))
        pos, prev = max(pos, end), info.name
    beyond = sorted((t for t in tensors.values() if t.data_offsets[1] > data_len),
                    key=lambda t: t.data_offsets)
    if beyond:
        first = beyond[0]
        problems.append(Problem(
            f"shard truncated or offsets out of range: data of {len(beyond)} tensor(s) ends past "
            f"the file (needs {pos} data bytes, file has {max(data_len, 0)})",
            file=where, field=first.name, fix=REDOWNLOAD))
    elif pos < data_len and len(sound) == len(tensors):
        problems.append(Problem(f"{data_len - pos} bytes after the last tensor's data",
                                file=where, field=prev, fix=REDOWNLOAD))


__all__ = ["Reader", "LocalReader", "CountingReader", "open_reader", "TensorInfo", "Note",
           "Checkpoint", "read_checkpoint", "read_header", "risk_text", "data",
           "single_file_problems", "check_loader_files"]
