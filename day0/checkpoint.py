"""Read a checkpoint from config.json and safetensors *headers* only; never tensor data.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON header
(``{name: {dtype, shape, data_offsets}}``), then the packed data. Reading 8 + N bytes per shard
gives every tensor's name, dtype, shape and position, so a 1 TB checkpoint is checked by reading
a few megabytes (``Checkpoint.bytes_read`` counts every byte read).

Files are reached through a tiny Reader (``names``/``size``/``read_range``); ``open_reader``
picks the implementation: a local folder, or an s3:// prefix read with ranged GETs
(day0.storage.S3Reader). Readers, config.json and the result types live in day0.checkpoint_io,
the header parser in day0.safetensors_header (shared with the release receiver); both are
re-exported here.

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
from collections import defaultdict
from pathlib import Path

from day0 import limits
from day0.checkpoint_io import (Checkpoint, CountingReader, LocalReader, Note, Reader,
                                check_loader_files, data, open_reader, parse_config_json,
                                risk_text, single_file_problems)
from day0.checkpoint_match import check_dtypes, match_model
from day0.errors import CheckpointError, InputError, Problem
from day0.safetensors_header import REDOWNLOAD, TensorInfo, max_header_bytes, read_header


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
    problems: list[Problem] = []
    shards_ok = _read_weights(reader, ckpt, problems)
    inflated = limits.size_problems(config, config_file, limits.stored_bytes(reader), ckpt.source)
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
           "Checkpoint", "read_checkpoint", "read_header", "risk_text", "data",
           "single_file_problems", "check_loader_files"]
