"""Cross-check a checkpoint's tensors with the model transformers builds from its config.json.

Checkpoint names are mapped to model parameters with transformers' own loading conversions
(e.g. Mixtral's ``block_sparse_moe.experts.N.w1`` -> ``mlp.experts.gate_up_proj``), so the
comparison is against exactly what ``from_pretrained`` would fill. Shape and count mismatches
are Problems (errors); tensors the class does not use and dtype surprises are Notes.

The caller brings the meta model (``check_checkpoint(source, model)``): the scan stage, which
builds it at full size anyway, and day0.checkpoint.modeling.load_pretrained before it reads a weight.
Header-only work (analysis) never gets here: it imports no transformers.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

from day0.checkpoint.headers import note_extras, ranges, read_checkpoint
from day0.checkpoint.files import Checkpoint, Note, Reader, data
from day0.errors import CheckpointError, Problem


def check_checkpoint(source: str | Path | Reader, model) -> Checkpoint:
    """Read source's headers and compare every tensor's name and shape with ``model`` (the meta
    model of its config.json); one CheckpointError lists every problem, the files' and the
    shapes'. Fills the roles transformers' class gives the tensors."""
    problems: list[Problem] = []
    ckpt = read_checkpoint(source, problems=problems)
    if ckpt.tensors:
        match_model(ckpt, model, problems, check_missing=ckpt.complete)
    if problems:
        raise CheckpointError.from_problems(problems)
    return ckpt


def _config_value(config: dict, key: str):
    for name in data()["config_fields"].get(key, [key]):
        if config.get(name) is not None:
            return name, config[name]
    return None, None


def _hint(config: dict, target: str) -> str:
    for rule in data()["shape_hints"]:
        if re.search(rule["pattern"], target):
            shown = [f"{f}={config[f]}" for f in rule["fields"] if config.get(f) is not None]
            return ", ".join(shown)
    return ""


def renamer(model):
    """checkpoint name -> (model state_dict name, converter source pattern), as transformers loads;
    and splits: the converter source patterns that one tensor fills several parameters from."""
    state = model.state_dict()
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (WeightConverter, WeightRenaming,
                                                     rename_source_key)

        mapping = get_model_conversion_mapping(model)
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
    except (ImportError, AttributeError, TypeError):  # private API moved: compare names as-is
        return state, (lambda key: (key, None)), False, {}
    # one fused tensor split on load (sarvam_moe's query_key_value -> q/k/v_proj): the renamed
    # key names the first target; the others are filled from the same tensor
    splits = {c.source_patterns[0]: list(getattr(c, "_original_target_patterns", c.target_patterns))
              for c in converters if len(c.source_patterns) == 1 and len(c.target_patterns) > 1}

    def rename(key: str):
        try:
            new, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, state)
        except Exception:  # noqa: BLE001 - a converter choking on a name means "no conversion"
            return key, None
        if new not in state and key in state:
            return key, None
        return new, pattern
    return state, rename, True, splits


def split_targets(target: str, pattern: str | None, splits: dict[str, list[str]]) -> list[str]:
    """Every parameter one checkpoint tensor fills: ``target`` and, for a split, its siblings
    (``target`` with the first target pattern replaced by each other one)."""
    names = splits.get(pattern or "")
    if not names or names[0] not in target:
        return [target]
    head, _, tail = target.rpartition(names[0])
    return [target] + [head + other + tail for other in names[1:]]


def match_model(ckpt: Checkpoint, model, problems: list[Problem], *, check_missing: bool = True) -> None:
    """Compare tensor names and shapes with the meta model transformers builds from config.json."""
    config = ckpt.config
    state, rename, converted, splits = renamer(model)
    ckpt.model_class = type(model).__name__
    if not converted:
        ckpt.notes.append(Note("checkpoint_note", "info", "transformers' checkpoint-name conversions "
                               "are unavailable; tensor names compared as they are"))
    quant = bool(config.get("quantization_config"))
    quant_aux = [re.compile(p) for p in data()["patterns"]["quant_aux"]]
    buffers = {n for n, _ in model.named_buffers()} & set(state)
    groups: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    filled: dict[str, list[str]] = {}  # a split's first target -> every parameter it fills
    for name in sorted(ckpt.tensors):
        target, pattern = rename(name)
        if target in state and len(parts := split_targets(target, pattern, splits)) > 1:
            filled[target] = [t for t in parts if t in state]
        if target in buffers:  # persistent buffers (e.g. router score bias) are not parameters
            groups[target].append((name, pattern))
            ckpt.roles[name] = "buffer"
        elif target in state:
            groups[target].append((name, pattern))
            ckpt.roles[name] = "model"
        elif quant and any(p.search(name) for p in quant_aux):
            ckpt.roles[name] = "quant"
        else:
            ckpt.roles[name] = "extra"
    for target, members in groups.items():
        parts = filled.get(target, [target])
        # a split tensor holds its parts along dim 0: compared as one of their summed rows
        shape = tuple(state[target].shape) if len(parts) == 1 else (
            sum(state[t].shape[0] for t in parts), *state[target].shape[1:])
        _check_group(ckpt, target, members, shape, problems)
    if check_missing:
        covered = set(groups) | {t for parts in filled.values() for t in parts}
        _check_missing(ckpt, model, state, covered, problems)
    note_extras(ckpt, type(model).__name__)


def _check_group(ckpt, target, members, shape, problems) -> None:
    config = ckpt.config
    first = ckpt.tensors[members[0][0]]
    where = ckpt.location(first.file)
    if len(members) == 1 and members[0][1] is None:
        if first.shape != shape:
            hint = _hint(config, target)
            problems.append(Problem(
                f"shape {list(first.shape)} but config.json implies {list(shape)}"
                + (f" ({hint})" if hint else ""), file=where, field=first.name,
                fix="correct config.json or re-export the checkpoint"))
        return
    # several checkpoint tensors merged into one parameter, e.g. per-expert -> fused [E, ...]
    indices = set()
    for name, pattern in members:
        regex = re.escape(pattern or "").replace(r"\*", r"(\d+)")
        m = re.search(regex, name) if pattern and "*" in pattern else None
        if m:
            indices.add(m.group(1))
    total = sum(ckpt.tensors[n].numel for n, _ in members)
    if indices and shape and len(indices) != shape[0]:
        fname, count = _config_value(config, "num_experts")
        problems.append(Problem(
            f"{len(indices)} experts in the checkpoint for {target} but config.json "
            + (f"says {fname}={count}" if fname else f"implies {shape[0]}"),
            file=where, field=first.name, fix="correct config.json or re-export the checkpoint"))
    elif total != math.prod(shape):
        hint = _hint(config, target)
        problems.append(Problem(
            f"{len(members)} tensors merged into {target} hold {total} elements but config.json "
            f"implies {list(shape)} = {math.prod(shape)}" + (f" ({hint})" if hint else ""),
            file=where, field=first.name, fix="correct config.json or re-export the checkpoint"))


def _check_missing(ckpt, model, state, covered, problems) -> None:
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    ignore = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_missing", None) or [])]
    missing = [k for k in state if k not in covered and k not in tied
               and not any(p.search(k) for p in ignore)]
    if not missing:
        return
    layer_re = re.compile(data()["patterns"]["layer"])
    per_layer: dict[int, set[str]] = defaultdict(set)
    for key in state:
        m = layer_re.search(key)
        if m:
            per_layer[int(m.group(1))].add(key)
    gone = sorted(i for i, keys in per_layer.items() if keys <= set(missing))
    where = ckpt.location(ckpt.index_file or next((f for f in ckpt.files if f.endswith(".safetensors")), None))
    if gone:
        present = len(per_layer) - len(gone)
        problems.append(Problem(
            f"layer count: checkpoint has {present} decoder layers, config.json says "
            f"num_hidden_layers={ckpt.config.get('num_hidden_layers')} (layers {ranges(gone)} missing)",
            file=where, field=f"model.layers.{gone[0]}",
            fix="correct num_hidden_layers or add the missing shards"))
        missing = [k for k in missing if not (layer_re.search(k) and int(layer_re.search(k).group(1)) in gone)]
    for key in missing:
        problems.append(Problem("parameter transformers expects is not in the checkpoint",
                                file=where, field=key,
                                fix="re-export the checkpoint or correct config.json"))


__all__ = ["check_checkpoint", "match_model", "renamer"]
