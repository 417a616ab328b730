"""Read a checkpoint from config.json and safetensors *headers* only; never tensor data.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header
(``{name: {dtype, shape, data_offsets}}``), then the packed data. Reading 8 + N bytes per shard
gives every tensor's name, dtype, shape and position, so a 1 TB checkpoint is checked by reading
a few megabytes (``Checkpoint.bytes_read`` counts every byte read).

Files are reached through a tiny Reader (``names``/``size``/``read_range``); ``open_reader``
picks the implementation: a local folder, or an s3:// prefix read with ranged GETs
(day0.store.s3.S3Reader). Readers, config.json and the result types live in day0.checkpoint.files,
the header parser in day0.checkpoint.safetensors_header (shared with the release receiver); both are
re-exported here. Nothing here imports torch or transformers (pyproject.toml's
analysis-no-torch contract).

Every problem found is collected and raised together as one :class:`CheckpointError`:
truncated shards, bad header lengths or offsets, non-JSON headers, index/shard disagreements,
unknown dtypes. Tensor roles come from :func:`classify` (header-only rules: analysis) or from
day0.checkpoint.match, which compares names and shapes with the model transformers builds from
config.json (scan, and every stage that loads the model). Things that load but deserve a look
(extra tensors such as MTP layers, dtype surprises) become :class:`Note` s instead.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from day0.checkpoint import limits
from day0.checkpoint.files import (Checkpoint, CountingReader, LocalReader, Note, Reader,
                                   check_loader_files, data, open_reader, parse_config_json,
                                   risk_text, single_file_problems)
from day0.errors import CheckpointError, InputError, Problem
from day0.checkpoint.safetensors_header import REDOWNLOAD, TensorInfo, max_header_bytes, read_header


# --------------------------------------------------------------------------- reading

def read_checkpoint(source: str | Path | Reader, *, problems: list[Problem] | None = None
                    ) -> Checkpoint:
    """Read and cross-check a checkpoint's files; raise one CheckpointError listing every problem.

    With ``problems`` given, what is wrong is appended there and the checkpoint returned (the
    caller adds the problems it finds, e.g. day0.checkpoint.match, and raises them together);
    ``ckpt.complete`` says whether every shard's header could be read. A config far bigger than
    its weights is raised at once either way. Tensor roles are left to :func:`classify` or
    day0.checkpoint.match.
    """
    reader = CountingReader(source if hasattr(source, "read_range") else open_reader(source))
    config, config_file = _read_config(reader)
    ckpt = Checkpoint(source=str(getattr(reader.inner, "path", source)), config=config,
                      config_file=config_file)
    _add_file(reader, ckpt, data()["files"]["config"])
    found: list[Problem] = []
    ckpt.complete = _read_weights(reader, ckpt, found)
    inflated = limits.size_problems(config, config_file, limits.stored_bytes(reader), ckpt.source)
    if inflated:  # a config far bigger than its weights: no model is built from it
        raise CheckpointError.from_problems(found + inflated)
    if ckpt.tensors:
        check_dtypes(ckpt)
    # an object store reader counts what went over the wire (speculative header reads included)
    ckpt.bytes_read = getattr(reader.inner, "bytes_fetched", reader.bytes_read)
    if problems is not None:
        problems.extend(found)
    elif found:
        raise CheckpointError.from_problems(found)
    return ckpt


# --------------------------------------------------------------------------- roles

def classify(ckpt: Checkpoint, *, layers: int | None, model_class: str | None = None) -> None:
    """Tensor roles by header-only rules (data/analysis.yaml patterns), for work that does not
    build transformers' class: quantization side tensors (``quant_aux``, with a
    quantization_config) are "quant", tensors the class does not use "extra" (decoder layers at
    or beyond ``layers`` = num_hidden_layers, e.g. DeepSeek-V3's MTP layer 61, and
    ``unused_by_class``), persistent buffers (``buffers``) "buffer", every other tensor "model".
    Extra tensors become a note. scan compares these roles with transformers' own."""
    patterns = data()["patterns"]
    quant = bool(ckpt.config.get("quantization_config"))
    quant_aux = [re.compile(p) for p in patterns["quant_aux"]]
    buffers = [re.compile(p) for p in patterns["buffers"]]
    unused = [re.compile(p) for p in patterns["unused_by_class"]]
    layer_re = re.compile(patterns["layer"])
    counted = isinstance(layers, int) and not isinstance(layers, bool)
    ckpt.model_class = model_class
    for name in sorted(ckpt.tensors):
        beyond = counted and (m := layer_re.search(name)) and int(m.group(1)) >= layers
        # the class match's order: what the class lacks is quant or extra, even a buffer's name
        if quant and any(p.search(name) for p in quant_aux):
            ckpt.roles[name] = "quant"
        elif beyond or any(p.search(name) for p in unused):
            ckpt.roles[name] = "extra"
        elif any(p.search(name) for p in buffers):
            ckpt.roles[name] = "buffer"
        else:
            ckpt.roles[name] = "model"
    note_extras(ckpt, model_class or "model class")


def note_extras(ckpt: Checkpoint, model_class: str) -> None:
    """One note for the tensors whose role is "extra" (not used by the model class)."""
    extras = sorted(n for n, r in ckpt.roles.items() if r == "extra")
    if not extras:
        return
    params = sum(ckpt.tensors[n].numel for n in extras)
    severity, message = risk_text("extra_tensors", count=len(extras), params=f"{params:,}",
                                  example=extras[0], cls=model_class)
    layer_re = re.compile(data()["patterns"]["layer"])
    layers = sorted({int(m.group(1)) for n in extras if (m := layer_re.search(n))})
    limit = ckpt.config.get("num_hidden_layers")
    beyond = [i for i in layers if isinstance(limit, int) and i >= limit]
    if beyond:
        message += f"; layers {ranges(beyond)} lie beyond num_hidden_layers={limit} (e.g. MTP)"
    ckpt.notes.append(Note("extra_tensors", severity, message,
                           ckpt.location(ckpt.tensors[extras[0]].file), extras[0]))


def ranges(numbers: list[int]) -> str:
    """Sorted integers as runs: [1, 2, 3, 7] -> '1..3, 7'."""
    out, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(f"{start}" if start == n else f"{start}..{n}")
            start = None
    return ", ".join(out)


def check_dtypes(ckpt: Checkpoint) -> None:
    """Dtypes other than config.json's torch_dtype are notes, not errors: they still load."""
    config = ckpt.config
    declared = config.get("torch_dtype") or config.get("dtype")
    expected = data()["config_dtypes"].get(str(declared))
    if expected is None:
        return
    quant = bool(config.get("quantization_config"))
    odd: dict[str, list[TensorInfo]] = defaultdict(list)
    for info in ckpt.tensors.values():
        if info.dtype != expected:
            odd[info.dtype].append(info)
    for dtype, infos in sorted(odd.items()):
        infos.sort(key=lambda t: t.name)
        if quant and dtype in data()["quantized_dtypes"]:
            severity, message = risk_text("quantized_dtypes", count=len(infos), dtype=dtype,
                                          example=infos[0].name)
            rid = "quantized_dtypes"
        else:
            severity, message = risk_text("dtype_surprise", count=len(infos), dtype=dtype,
                                          config_dtype=declared, example=infos[0].name)
            rid = "dtype_surprise"
            if all(len(t.shape) <= 1 for t in infos):  # norms/biases kept wider: common, harmless
                severity = "info"
        ckpt.notes.append(Note(rid, severity, message, ckpt.location(infos[0].file), infos[0].name))


def _read_config(reader: CountingReader) -> tuple[dict, str]:
    name = data()["files"]["config"]
    where = reader.location(name)
    if name not in reader.names():
        raise InputError("no config.json found", file=where,
                         fix="pass a checkpoint folder containing config.json, or a config.json file")
    limits.check_config_size(reader.size(name), where)  # before reading: it may be any size
    config = parse_config_json(reader.read_range(name, 0, reader.size(name)), where)
    limits.check_config(config, where)  # refused before a single header is read or anything is built
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
        if reader.size(index) > max_header_bytes():  # not read into memory at all
            raise ValueError(f"{reader.size(index)} bytes, over {max_header_bytes()}")
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


__all__ = ["Reader", "LocalReader", "CountingReader", "open_reader", "TensorInfo", "Note",
           "Checkpoint", "read_checkpoint", "classify", "note_extras", "check_dtypes", "ranges",
           "read_header", "risk_text", "data", "single_file_problems", "check_loader_files"]
