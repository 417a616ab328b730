"""A seeded corpus of hostile checkpoints made from the bundled fixtures (issue 9: every input is
untrusted).

``corpus()`` lists the mutants, the same ones on every run (fixed seed, sorted inputs);
``materialize(mutant, root)`` writes one as a folder: every file of its fixture is a hard link to
one copy of the committed file under root (a symlink out of a checkpoint is itself refused as
hostile), except the ones the mutation rewrites, which are unlinked first and written anew (so a
few hundred mutants cost a few MB and never touch tests/fixtures/).

Kinds: ``config`` (config.json values: huge, negative, zero, wrong type, nested, unknown enums),
``json`` (config.json structure: deep nesting, huge key counts, truncation, bad encodings),
``header`` (safetensors headers: lengths, offsets, dtypes, shapes, metadata, extra entries) and
``index`` (model.safetensors.index.json: empty, huge, pointing outside, malformed).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tests.conftest import MODELS

SEED = 9
FIXTURES = ("tiny-llama", "tiny-qwen3moe", "tiny-deepseekv3")
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Mutant:
    name: str       # unique and stable: kind/what@fixture
    fixture: str
    kind: str
    apply: Callable[[Path], None]


# ------------------------------------------------------------------------------- file helpers

def write(folder: Path, name: str, data: bytes) -> None:
    """Replace a file of a mutant folder; the link to the fixture's copy is removed first."""
    path = folder / name
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_bytes(data)


def read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def write_config(folder: Path, config) -> None:
    write(folder, "config.json", json.dumps(config).encode())


def shard_names(fixture: str) -> list[str]:
    return sorted(set(json.loads((MODELS / fixture / INDEX).read_text())["weight_map"].values()))


def split_shard(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_shard(folder: Path, name: str, header, body: bytes, length: int | None = None) -> None:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    write(folder, name, struct.pack("<Q", len(blob) if length is None else length) + blob + body)


def nested(depth: int, leaf=1):
    """JSON text nested depth levels deep (lists), built without recursion."""
    return "[" * depth + json.dumps(leaf) + "]" * depth


# ------------------------------------------------------------------------------- config values

# hostile values for an integer dimension: CORE on every field, two of the others seeded
CORE = [0, -1, 10**9, 2**63]
HUGE = [10**6, 10**9, 2**31, 2**63, 2**64 + 7, 10**30]
SMALL = [0, -1, -(2**63)]
WRONG_TYPE = ["4", 4.5, 1e9, True, None, [], {}, [4], {"value": 4}, float("inf"), float("nan"),
              "x" * 2000]


def set_field(path: str, value):
    """A mutation that sets a (dotted) config field."""
    def apply(folder: Path) -> None:
        config = read_config(folder)
        *parents, leaf = path.split(".")
        node = config
        for key in parents:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[leaf] = value
        write(folder, "config.json", json.dumps(config, allow_nan=True).encode())
    return apply


def delete_field(name: str):
    def apply(folder: Path) -> None:
        config = read_config(folder)
        config.pop(name, None)
        write_config(folder, config)
    return apply


def raw_field(name: str, text: str):
    """Set a field to raw JSON text (deep nesting, long numbers) that json.dumps cannot write."""
    def apply(folder: Path) -> None:
        config = read_config(folder)
        config[name] = "@@RAW@@"
        write(folder, "config.json", json.dumps(config).replace('"@@RAW@@"', text).encode())
    return apply


def _int_fields(config: dict) -> list[str]:
    return sorted(k for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool))


def int_mutants(fixture: str, rng: random.Random) -> list[Mutant]:
    """Every integer field of the fixture's config: zero, negative, huge, and two seeded others."""
    config = json.loads((MODELS / fixture / "config.json").read_text())
    out = []
    for name in _int_fields(config):
        values = CORE + rng.sample([v for v in SMALL + HUGE + WRONG_TYPE if v not in CORE], 2)
        for value in values:
            out.append(Mutant(f"config/{name}={repr(value)[:24]}@{fixture}", fixture, "config",
                              set_field(name, value)))
    return out


def value_mutants(pick: Callable[[], str]) -> list[Mutant]:
    """Enums, wrong types and nesting of the other fields, each on one seeded fixture."""
    out = []
    enums = {
        "hidden_act": ["nonesuch", "", 7, ["silu"]],
        "rope_parameters.rope_type": ["nonesuch", "yarn", 3, None],
        "rope_parameters.rope_theta": [-1.0, 0, "big", 1e308],
        "rope_parameters.factor": [-2.0, 0, "x"],
        "rope_parameters": ["default", [], 5],
        "rope_scaling": [{"type": "nonesuch", "factor": 2.0}, {"rope_type": "linear"}, "x"],
        "model_type": [123, None, "nonesuch", ["llama"], ""],
        "architectures": [None, [], ["NoneSuchForCausalLM"], "LlamaForCausalLM", [1, 2], {}],
        "dtype": ["float99", 5, ["bfloat16"]],
        "torch_dtype": ["float99", 5],
        "tie_word_embeddings": ["yes", 2, None],
        "layer_types": [["nonesuch"] * 4, "full_attention", [1, 2, 3, 4], ["full_attention"] * 1000],
        "quantization_config": [{"quant_method": "nonesuch"}, "fp8", [], {"quant_method": "fp8"}],
        "auto_map": [5, {"AutoConfig": 5}, {"AutoModelForCausalLM": "x.Y"}],
        "rms_norm_eps": [-1.0, "tiny", None, 0],
        "sliding_window": [0, -4, 10**12, "4096"],
        "text_config": [{"num_hidden_layers": 10**9}, {"hidden_size": -1}, "x", {"vocab_size": 0}],
        "use_cache": ["no", 3],
        "pad_token_id": [-5, 10**12, "x"],
        "bos_token_id": [10**12, [1, 2]],
    }
    for field, values in enums.items():
        for value in values:
            fixture = pick()
            out.append(Mutant(f"config/{field}={repr(value)[:24]}@{fixture}", fixture, "config",
                              set_field(field, value)))
    for name in ("num_hidden_layers", "hidden_size", "vocab_size", "model_type", "architectures",
                 "rope_parameters", "num_attention_heads"):
        fixture = pick()
        out.append(Mutant(f"config/del-{name}@{fixture}", fixture, "config", delete_field(name)))
    raw = {"layers-nested": ("num_hidden_layers", nested(100)),
           "rope-nested-5000": ("rope_parameters", nested(5000)),
           "layers-4000-digits": ("num_hidden_layers", "9" * 4000),
           "layers-5000-digits": ("num_hidden_layers", "9" * 5000),
           "layers-1e999": ("num_hidden_layers", "1e999"), "layers-NaN": ("num_hidden_layers", "NaN"),
           "heads--Infinity": ("num_attention_heads", "-Infinity")}
    for label, (name, text) in raw.items():
        fixture = pick()
        out.append(Mutant(f"config/{label}@{fixture}", fixture, "config", raw_field(name, text)))
    return out


# ------------------------------------------------------------------------------- JSON structure

def json_mutants(fixture: str, rng: random.Random) -> list[Mutant]:
    """config.json's structure; all of them on each fixture, they are cheap."""
    original = (MODELS / fixture / "config.json").read_bytes()
    cuts = sorted(rng.sample(range(1, len(original) - 1), 3))
    many_keys = {**json.loads(original), **{f"k{i}": i for i in range(100_000)}}
    cases: dict[str, bytes] = {
        "empty": b"",
        "whitespace": b"   \n",
        "null": b"null",
        "list": b"[1, 2, 3]",
        "number": b"42",
        "string": b'"llama"',
        "deep-list-100k": nested(100_000).encode(),
        "deep-dict-3000": ('{"a":' * 3000 + "1" + "}" * 3000).encode(),
        "deep-value-900": original.replace(b'"use_cache"',
                                           b'"deep": ' + nested(900).encode() + b', "use_cache"'),
        "many-keys-100k": json.dumps(many_keys).encode(),
        "duplicate-keys": original.replace(b'"vocab_size"', b'"vocab_size": -3, "vocab_size"'),
        "bom": b"\xef\xbb\xbf" + original,
        "latin1": b'{"model_type": "ll\xe4ma", ' + original.lstrip()[1:],
        "nul-bytes": original[:20] + b"\x00" * 64 + original[20:],
        "over-8MB": original[:-2] + b', "pad": "' + b"x" * (9 * 2**20) + b'"}',
        "trailing-garbage": original + b"}}}",
        "nan-literals": original.replace(b'"rms_norm_eps": 1e-06', b'"rms_norm_eps": NaN'),
    }
    for cut in cuts:
        cases[f"truncated-{cut}"] = original[:cut]
    return [Mutant(f"json/{name}@{fixture}", fixture, "json", _fixed("config.json", data))
            for name, data in cases.items()]


def _fixed(name: str, data: bytes):
    def apply(folder: Path) -> None:
        write(folder, name, data)
    return apply


# ------------------------------------------------------------------------------- safetensors headers

def edit_header(shard: str, edit: Callable[[dict, bytes], tuple]):
    """edit(header, body) -> (header or raw bytes, body[, declared length])."""
    def apply(folder: Path) -> None:
        header, body = split_shard(folder / shard)
        write_shard(folder, shard, *edit(header, body))
    return apply


def _first_tensor(header: dict) -> str:
    return sorted(k for k in header if k != "__metadata__")[0]


def _set_entry(key: str, value):
    def edit(header, body):
        header[_first_tensor(header)][key] = value
        return header, body
    return edit


def _replace_entry(value):
    def edit(header, body):
        header[_first_tensor(header)] = value
        return header, body
    return edit


def _header_edits() -> dict[str, Callable]:
    def extra(n):
        def edit(header, body):
            entry = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
            header.update({f"model.bogus.{i}.weight": dict(entry) for i in range(n)})
            return header, body
        return edit

    def metadata(value):
        def edit(header, body):
            header["__metadata__"] = value
            return header, body
        return edit

    def length(n):
        return lambda header, body: (header, body, n)

    def raw(text: bytes):
        return lambda header, body: (text, body)

    def drop_tensor(header, body):
        header.pop(_first_tensor(header))
        return header, body

    def swap_offsets(header, body):
        a, b = sorted(k for k in header if k != "__metadata__")[:2]
        header[a]["data_offsets"], header[b]["data_offsets"] = (header[b]["data_offsets"],
                                                                header[a]["data_offsets"])
        return header, body

    edits = {
        "length-0": length(0), "length-7": length(7), "length-2^63": length(2**63),
        "length-2^64-1": length(2**64 - 1), "length-past-end": length(10**7),
        "not-json": raw(b"{" * 64), "json-list": raw(b"[1,2,3]"), "json-null": raw(b"null"),
        "not-utf8": raw(b'{"\xff\xfe": 1}'), "deep-100k": raw(nested(100_000).encode()),
        "offsets-negative": _set_entry("data_offsets", [-8, 0]),
        "offsets-reversed": _set_entry("data_offsets", [64, 0]),
        "offsets-huge": _set_entry("data_offsets", [0, 2**70]),
        "offsets-three": _set_entry("data_offsets", [0, 4, 8]),
        "offsets-floats": _set_entry("data_offsets", [0.0, 4.5]),
        "offsets-string": _set_entry("data_offsets", "0-4"),
        "offsets-bools": _set_entry("data_offsets", [False, True]),
        "offsets-swapped": swap_offsets,
        "dtype-unknown": _set_entry("dtype", "F7"), "dtype-lower": _set_entry("dtype", "f32"),
        "dtype-int": _set_entry("dtype", 32), "dtype-list": _set_entry("dtype", ["F32"]),
        "dtype-null": _set_entry("dtype", None),
        "shape-negative": _set_entry("shape", [-1, 4]), "shape-float": _set_entry("shape", [2.5]),
        "shape-huge": _set_entry("shape", [2**62, 2**62, 2**62]),
        "shape-1000-dims": _set_entry("shape", [1] * 1000), "shape-string": _set_entry("shape", "4x4"),
        "shape-bool": _set_entry("shape", [True]), "shape-nested": _set_entry("shape", [[4]]),
        "entry-not-object": _replace_entry(5),
        "entry-missing-key": _replace_entry({"shape": [4], "data_offsets": [0, 16]}),
        "metadata-int": metadata(5), "metadata-list": metadata(["a"]),
        "metadata-nested": metadata({"format": {"pt": 1}}),
        "metadata-number-value": metadata({"format": 1}),
        "metadata-null": metadata(None), "metadata-deep": lambda h, b: (
            json.dumps(h)[:-1].encode() + b', "__metadata__": ' + nested(2000).encode() + b"}", b),
        "extra-10": extra(10), "extra-100k": extra(100_000), "drop-tensor": drop_tensor,
        "body-cut": lambda h, b: (h, b[:len(b) // 2]), "body-grown": lambda h, b: (h, b + bytes(4096)),
        "body-empty": lambda h, b: (h, b""),
    }
    return edits


def header_mutants(pick: Callable[[], str], rng: random.Random) -> list[Mutant]:
    """Each header edit on one seeded fixture and shard."""
    out = []
    edits = {**_header_edits(), "file-5-bytes": None, "file-empty": None}
    for name, edit in edits.items():
        fixture = pick()
        shard = rng.choice(shard_names(fixture))
        apply = (edit_header(shard, edit) if edit else
                 _fixed(shard, b"\x01" * 5 if name == "file-5-bytes" else b""))
        out.append(Mutant(f"header/{name}@{fixture}:{shard[6:11]}", fixture, "header", apply))
    return out


# ------------------------------------------------------------------------------- index

def edit_index(edit: Callable[[dict], object]):
    def apply(folder: Path) -> None:
        doc = json.loads((folder / INDEX).read_text())
        result = edit(doc)
        write(folder, INDEX, result if isinstance(result, bytes) else json.dumps(doc).encode())
    return apply


def index_mutants(fixture: str, rng: random.Random) -> list[Mutant]:
    """The shard index; its few cases run on each fixture."""
    shards = shard_names(fixture)

    def weight_map(value):
        return lambda doc: doc.__setitem__("weight_map", value)

    tensors = sorted(json.loads((MODELS / fixture / INDEX).read_text())["weight_map"])

    def remap(target: str):
        tensor = rng.choice(tensors)  # chosen here, not when applied: the corpus stays fixed
        return lambda doc: doc["weight_map"].__setitem__(tensor, target)

    def extra(n):
        return lambda doc: doc["weight_map"].update(
            {f"model.extra.{i}.weight": shards[0] for i in range(n)})

    cases = {
        "empty": weight_map({}), "null": weight_map(None), "list": weight_map([shards[0]]),
        "string": weight_map(shards[0]), "values-int": lambda d: d["weight_map"].update(
            {k: 1 for k in list(d["weight_map"])[:3]}),
        "missing": lambda d: d.pop("weight_map"), "doc-list": lambda d: b"[]",
        "doc-empty": lambda d: b"",
        "not-json": lambda d: b"{weight_map:", "deep": lambda d: nested(100_000).encode(),
        "extra-100k": extra(100_000), "extra-10": extra(10),
        "outside-parent": remap("../" + shards[0]), "outside-absolute": remap("/etc/passwd"),
        "outside-fixture": remap(f"../../{fixture}/{shards[0]}"), "subdir": remap("sub/" + shards[0]),
        "nonexistent-shard": remap("model-99999-of-99999.safetensors"), "empty-name": remap(""),
        "metadata-total-size-lies": lambda d: d.setdefault("metadata", {}).update(total_size=10**18),
        "metadata-int": lambda d: d.__setitem__("metadata", 5),
    }
    out = [Mutant(f"index/{name}@{fixture}", fixture, "index", edit_index(edit))
           for name, edit in cases.items()]

    def no_index(folder: Path) -> None:
        (folder / INDEX).unlink()
    out.append(Mutant(f"index/removed@{fixture}", fixture, "index", no_index))
    return out


# ------------------------------------------------------------------------------- the corpus

def corpus(seed: int = SEED) -> list[Mutant]:
    """Every mutant, in a fixed order; the same list for the same seed."""
    rng = random.Random(seed)

    def pick() -> str:
        return rng.choice(FIXTURES)

    out: list[Mutant] = []
    for fixture in FIXTURES:
        out += int_mutants(fixture, rng) + json_mutants(fixture, rng) + index_mutants(fixture, rng)
    out += value_mutants(pick) + header_mutants(pick, rng)
    names = [m.name for m in out]
    assert len(set(names)) == len(names), "mutant names must be unique"
    return out


def materialize(mutant: Mutant, root: Path) -> Path:
    """The mutant as a folder under root: hard links to one copy of the fixture's files (made
    under root once, so on its file system), the mutated ones real."""
    folder = root / f"{mutant.fixture}~{hashlib.sha1(mutant.name.encode()).hexdigest()[:12]}"
    folder.mkdir(parents=True)
    pristine = root / ".fixtures" / mutant.fixture
    if not pristine.is_dir():
        staging = root / ".fixtures" / f".{mutant.fixture}.{os.getpid()}"
        shutil.copytree(MODELS / mutant.fixture, staging)
        try:
            staging.rename(pristine)
        except OSError:  # another worker made it first
            shutil.rmtree(staging, ignore_errors=True)
    for path in sorted(pristine.iterdir()):
        os.link(path, folder / path.name)
    mutant.apply(folder)
    return folder
