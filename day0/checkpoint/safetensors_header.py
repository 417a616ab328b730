"""The safetensors header: the one parser, for analysis and for the release receiver.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header
(``{name: {dtype, shape, data_offsets}}``), then the packed data. Reading 8 + N bytes gives
every tensor's name, dtype, shape and position.

* :func:`header_length` and :func:`parse_header`: the length (within the one limit,
  ``max_safetensors_header_bytes`` in data/limits.yaml, safetensors' own) and the JSON object;
* :func:`expected_size`: how big the whole file must be, from its header alone (the receiver's
  "has the upload finished?");
* :func:`read_header`: every tensor as a :class:`TensorInfo`, with each layout problem
  (offsets, overlaps, gaps, truncation, unknown dtypes) as a Problem (day0.checkpoint.headers).

Torch-free by contract (the receiver imports it): json, struct and day0.checkpoint.limits only.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

from day0.errors import Problem
from day0.checkpoint.limits import limits

REDOWNLOAD = "re-download or re-export this shard"
# safetensors dtype -> bits per element (safetensors' own list; sub-byte types are packed)
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "F64": 64, "I64": 64, "U64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}


class HeaderError(ValueError):
    """The first bytes are not a usable safetensors header (too short, too long, not JSON)."""


def max_header_bytes() -> int:
    """The largest header (and shard index) day0 reads: safetensors' own limit."""
    return int(limits()["max_safetensors_header_bytes"])


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


def header_length(first: bytes, size: int | None = None) -> int:
    """N from the file's first 8 bytes; HeaderError when there are fewer, when N is over the
    limit, or (size given) when N runs past the end of a file of that size."""
    if len(first) < 8:
        raise HeaderError(f"file is {len(first) if size is None else size} bytes, shorter than "
                          "the 8-byte header length")
    (length,) = struct.unpack("<Q", first[:8])
    # the length is the file's first 8 bytes: named only when it could be a header's, so that
    # an error never echoes the content of a file that is no safetensors file
    if size is not None and length > size - 8:
        raise HeaderError(f"the header length (the first 8 bytes) runs past the end of the file "
                          f"({size} bytes)")
    if length > max_header_bytes():
        raise HeaderError(f"the header length (the first 8 bytes) exceeds safetensors' limit "
                          f"{max_header_bytes()}")
    return length


def parse_header(raw: bytes) -> dict:
    """The header's JSON object; HeaderError when it is not one."""
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HeaderError(f"header is not valid JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise HeaderError("header is not valid JSON (ValueError: header is not a JSON object)")
    return header


def expected_size(length: int, header: dict) -> int:
    """8 + N + the end of the last tensor's data: the size of the complete file."""
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    return 8 + length + max(ends, default=0)


def read_header(reader, shard: str, problems: list[Problem]) -> dict[str, TensorInfo] | None:
    """One shard's tensors from its header (reader: day0.checkpoint.files.Reader), or None when the
    header itself is unusable.

    Layout problems (offsets out of range, overlaps, gaps, truncation) are appended to
    problems; the tensors are still returned so the other checks can run on them.
    """
    where = reader.location(shard)
    size = reader.size(shard)
    try:
        length = header_length(reader.read_range(shard, 0, 8) if size >= 8 else b"", size)
        header = parse_header(reader.read_range(shard, 8, length))
    except HeaderError as exc:
        fix = REDOWNLOAD + (" (truncated or not a safetensors file)" if "header length" in str(exc)
                            else "")
        problems.append(Problem(str(exc), file=where, fix=fix))
        return None
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict)
                                 and all(isinstance(v, str) for v in meta.values())):
        # safetensors' loader accepts only a map of strings to strings: transformers could not load it
        problems.append(Problem("__metadata__ is not a JSON object of strings", file=where,
                                field="__metadata__", fix=REDOWNLOAD))
    tensors: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        info = _tensor_info(name, meta, shard, where, problems)
        if info is not None:
            tensors[name] = info
    _check_layout(tensors, size - 8 - length, where, problems)
    return tensors


def _tensor_info(name, meta, shard, where, problems) -> TensorInfo | None:
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
    if dtype not in DTYPE_BITS:
        problems.append(Problem(f"unknown safetensors dtype '{dtype}'", file=where, field=name,
                                fix=f"re-export with one of {', '.join(DTYPE_BITS)}"))
        return None
    info = TensorInfo(name, shard, dtype, tuple(shape), (offsets[0], offsets[1]))
    need = _need(info)
    if info.nbytes != need:
        problems.append(Problem(f"data_offsets span {info.nbytes} bytes but {dtype}{list(shape)} "
                                f"needs {need}", file=where, field=name, fix=REDOWNLOAD))
    return info


def _need(info: TensorInfo) -> int:
    return -(-info.numel * DTYPE_BITS[info.dtype] // 8)  # integers: a hostile shape overflows floats


def _check_layout(tensors: dict[str, TensorInfo], data_len: int, where: str,
                  problems: list[Problem]) -> None:
    """Tensors must tile the data section exactly, as safetensors itself requires on load.

    An entry whose span disagrees with its shape is already reported; it is left out of the
    tiling check so one corrupt entry does not also show up as overlaps with all the others."""
    pos, prev = 0, None
    sound = [t for t in tensors.values() if t.nbytes == _need(t)]
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
            f"the file (needs {max(t.data_offsets[1] for t in beyond)} data bytes, file has "
            f"{max(data_len, 0)})",
            file=where, field=first.name, fix=REDOWNLOAD))
    elif pos < data_len and len(sound) == len(tensors):
        problems.append(Problem(f"{data_len - pos} bytes after the last tensor's data",
                                file=where, field=prev, fix=REDOWNLOAD))


__all__ = ["TensorInfo", "HeaderError", "DTYPE_BITS", "REDOWNLOAD", "max_header_bytes",
           "header_length", "parse_header", "expected_size", "read_header"]
