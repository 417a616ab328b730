"""A checkpoint's files, read without transformers: readers, config.json, what a read finds.

The lower half of day0.checkpoint.headers, so that model loading in day0.checkpoint.modeling reads config.json
without the header reader (no import cycles; tests/test_layers.py):

* :class:`Reader` (``names``/``size``/``read_range``/``location``) and ``open_reader(source)``:
  a local folder or config.json, or an s3:// prefix read with ranged GETs (day0.store.s3);
* ``read_config(source)``: config.json as a dict, within day0.checkpoint.limits, for a local or s3://
  source (``parse_config_json``, ``config_path``, ``read_config_dict``);
* :class:`Checkpoint` and :class:`Note`: what reading a checkpoint finds; ``data()`` and
  ``risk_text()``: day0/data/analysis.yaml (file names, patterns, risk texts);
* ``single_file_problems`` / ``check_loader_files``: the one rule on which files transformers
  loads.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import yaml

from day0.errors import CheckpointError, InputError, Problem
from day0.checkpoint.limits import check_config_size
from day0.checkpoint.safetensors_header import TensorInfo

DATA_FILE = Path(__file__).parents[1] / "data" / "analysis.yaml"
CONFIG = "config.json"
CONFIG_FIX = "restore config.json from the model's release"


@lru_cache(maxsize=1)
def data() -> dict:
    """day0/data/analysis.yaml (file names, name patterns, risk texts)."""
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
        from day0.store.links import refuse_escaping

        path = Path(path)
        if path.is_dir():
            refuse_escaping(path)  # never read a file the checkpoint links to elsewhere
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
        from day0.store.s3 import S3Reader

        return S3Reader(str(source))
    if str(source).startswith(("gs://", "http://", "https://")):
        raise InputError("only local paths and s3:// URIs are supported", file=str(source),
                         fix="copy the checkpoint to an S3-compatible bucket or a local folder")
    return LocalReader(source)


# --------------------------------------------------------------------------- config.json

def config_path(source: str | Path) -> Path:
    """config.json of a checkpoint folder, or the file itself."""
    path = Path(source)
    if path.is_dir():
        path = path / CONFIG
    if not path.is_file():
        raise InputError("no config.json found", file=str(path),
                         fix="pass a checkpoint folder containing config.json, or a config.json file")
    return path


# transformers' save_pretrained writes non-finite floats as {"__float__": "Infinity"} (e.g.
# falcon_h1's time_step_limit) and from_pretrained decodes them: so does day0, or it would refuse
# a config transformers loads
SPECIAL_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _special_float(obj: dict):
    if len(obj) == 1 and isinstance(obj.get("__float__"), str) and obj["__float__"] in SPECIAL_FLOATS:
        return SPECIAL_FLOATS[obj["__float__"]]
    return obj


def parse_config_json(raw: bytes, where: str) -> dict:
    """config.json bytes -> dict (non-finite floats decoded as transformers does), or an
    InputError naming where it came from."""
    check_config_size(len(raw), where)
    try:
        parsed = json.loads(raw.decode("utf-8"), object_hook=_special_float)
    except (ValueError, UnicodeDecodeError) as exc:  # ValueError: bad JSON, or an over-long integer
        raise InputError(f"not valid JSON ({exc})", file=where, fix=CONFIG_FIX) from None
    except RecursionError:  # the parser recurses per nesting level
        raise InputError("nested too deeply to parse", file=where, fix=CONFIG_FIX) from None
    if not isinstance(parsed, dict):
        raise InputError("config.json must hold a JSON object", file=where, fix=CONFIG_FIX)
    return parsed


def read_config(source: str | Path) -> tuple[dict, str]:
    """(config.json as a dict, its location) for a local or s3:// source (s3: one LIST, one GET)."""
    from day0.store.s3 import checkpoint_objects, is_s3, read_object

    if not is_s3(source):
        path = config_path(source)
        check_config_size(path.stat().st_size, str(path))  # before reading: it may be any size
        return parse_config_json(path.read_bytes(), str(path)), str(path)
    folder, objects = checkpoint_objects(source)
    info = objects.get(CONFIG)
    where = f"s3://{folder.bucket}/{info.key}" if info else str(folder.child(CONFIG))
    if info is None:
        raise InputError("no config.json found", file=where,
                         fix="upload config.json next to the weights, or pass the right prefix")
    check_config_size(info.size, where)  # before the GET: it may be any size
    return parse_config_json(read_object(where), where), where


def read_config_dict(source: str | Path) -> dict:
    """read_config without the location."""
    return read_config(source)[0]


# --------------------------------------------------------------------------- results

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
    complete: bool = True  # every shard's header was read (a missing tensor then is missing)

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


# --------------------------------------------------------------------------- loader files

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


__all__ = ["Reader", "LocalReader", "CountingReader", "open_reader", "config_path",
           "parse_config_json", "read_config", "read_config_dict", "Note", "Checkpoint",
           "data", "risk_text", "single_file_problems", "check_loader_files"]
