"""Read single tensors (or rows, or one expert's slab) of a safetensors checkpoint by byte range.

The streamed path reads each layer's weights when it needs them. Reads go into a fresh buffer
(``readinto`` locally, ranged GETs from s3://), never through a memory map: mapped pages count
in the process's resident memory until the file is closed, which would defeat the bound
streaming exists for. ``bytes_read`` counts what was read.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import torch

from day0.checkpoint.headers import read_checkpoint
from day0.checkpoint.files import open_reader
from day0.errors import CheckpointError

TORCH_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
    "F32": torch.float32, "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}


class WeightStore:
    """Tensors of one checkpoint by name (local folder or s3:// prefix)."""

    def __init__(self, source: str | Path, *, tensors: dict | None = None, reader=None):
        self.source = str(source)
        self.reader = reader or open_reader(source)  # reader: one its caller opened already
        self.tensors = (tensors if tensors is not None
                        else read_checkpoint(self.reader).tensors)
        self._data_start: dict[str, int] = {}
        self._files: dict[str, object] = {}
        self.bytes_read = 0

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors[name].shape)

    def nbytes(self, name: str) -> int:
        return self.tensors[name].nbytes

    def read(self, name: str, dtype: torch.dtype | None = None, *, rows: tuple[int, int] | None
             = None, index: int | None = None) -> torch.Tensor:
        """The tensor (or rows [a, b) of its first dim, or its slab ``index`` along the first
        dim), converted to dtype."""
        info = self._info(name)
        stored = TORCH_DTYPES[info.dtype]
        item = torch.empty((), dtype=stored).element_size()
        shape = tuple(info.shape)
        start = info.data_offsets[0]
        if index is not None:
            shape = shape[1:]
            start += index * math.prod(shape) * item
        elif rows is not None:
            a, b = rows
            start += a * math.prod(shape[1:]) * item
            shape = (b - a, *shape[1:])
        raw = self._bytes(info.file, start, math.prod(shape) * item)
        tensor = raw.view(stored).reshape(shape)
        return tensor if dtype is None or dtype == stored else tensor.to(dtype)

    def gather_rows(self, name: str, ids: list[int], dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` (sorted, unique) of a 2-D tensor: an embedding's rows for the tokens
        present, without reading the whole table. Adjacent ids are read together."""
        runs: list[list[int]] = []
        for i in ids:
            if runs and i == runs[-1][1]:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
        return torch.cat([self.read(name, dtype, rows=(a, b)) for a, b in runs])

    def _info(self, name: str):
        if name not in self.tensors:
            raise CheckpointError(f"tensor '{name}' is not in the checkpoint", file=self.source,
                                  fix="re-export the checkpoint with every weight the model "
                                      "class needs")
        return self.tensors[name]

    def _bytes(self, file: str, offset: int, length: int) -> torch.Tensor:
        start = self._start(file) + offset
        out = torch.empty(length, dtype=torch.uint8)
        local = getattr(self.reader, "path", None)
        if local is not None and Path(local).is_dir():
            handle = self._files.get(file)
            if handle is None:
                handle = self._files[file] = open(Path(local) / file, "rb", buffering=0)
            handle.seek(start)
            view, done = memoryview(out.numpy()), 0
            while done < length:
                got = handle.readinto(view[done:])
                if not got:
                    raise CheckpointError(f"{file} ends before tensor data it declares",
                                          file=file, fix="re-download or re-export this shard")
                done += got
        elif length:
            out = torch.frombuffer(bytearray(self.reader.read_range(file, start, length)),
                                   dtype=torch.uint8)
        self.bytes_read += length
        return out

    def _start(self, file: str) -> int:
        if file not in self._data_start:
            (n,) = struct.unpack("<Q", self.reader.read_range(file, 0, 8))
            self._data_start[file] = 8 + n
        return self._data_start[file]

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()


__all__ = ["WeightStore", "TORCH_DTYPES"]
