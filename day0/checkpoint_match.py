"""Cross-check a checkpoint's tensors with the model transformers builds from its config.json.

Checkpoint names are mapped to model parameters with transformers' own loading conversions
(e.g. Mixtral's ``block_sparse_moe.experts.N.w1`` -> ``mlp.experts.gate_up_proj``), so the
comparison is against exactly what ``from_pretrained`` would fill. Shape and count mismatches
are Problems (errors); tensors the class does not use and dtype surprises are Notes.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from day0.checkpoint_io import Checkpoint, Note, data, risk_text
from day0.errors import Problem
from day0.safetensors_header import TensorInfo


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
    """checkpoint name -> (model state_dict name, converter source pattern), as transformers loads."""
    state = model.state_dict()
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (WeightConverter, WeightRenaming,
                                                     rename_source_key)

        mapping = get_model_conversion_mapping(model)
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
    except (ImportError, AttributeError, TypeError):  # private API moved: compare names as-is
        return state, (lambda key: (key, None)), False

    def rename(key: str):
        try:
            new, pattern = rename_source_key(key, renamings, converters, model.base_model_prefix, state)
        except Exception:  # noqa: BLE001 - a converter choking on a name means "no conversion"
            return key, None
        if new not in state and key in state:
            return key, None
        return new, pattern
    return state, rename, True


def match_model(ckpt: Checkpoint, model, problems: list[Problem], *, check_missing: bool = True) -> None:
    """Compare tensor names and shapes with the meta model transformers builds from config.json."""
    config = ckpt.config
    state, rename, converted = renamer(model)
    ckpt.model_class = type(model).__name__
    if not converted:
        ckpt.notes.append(Note("checkpoint_note", "info", "transformers' checkpoint-name conversions "
                               "are unavailable; tensor names compared as they are"))
    quant = bool(config.get("quantization_config"))
    quant_aux = [re.compile(p) for p in data()["patterns"]["quant_aux"]]
    buffers = {n for n, _ in model.named_buffers()} & set(state)
    groups: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for name in sorted(ckpt.tensors):
        target, pattern = rename(name)
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
        _check_group(ckpt, target, members, tuple(state[target].shape), problems)
    if check_missing:
        _check_missing(ckpt, model, state, groups, problems)
    _note_extras(ckpt, model)


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


def _check_missing(ckpt, model, state, groups, problems) -> None:
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    ignore = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_missing", None) or [])]
    missing = [k for k in state if k not in groups and k not in tied
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
            f"num_hidden_layers={ckpt.config.get('num_hidden_layers')} (layers {_ranges(gone)} missing)",
            file=where, field=f"model.layers.{gone[0]}",
            fix="correct num_hidden_layers or add the missing shards"))
        missing = [k for k in missing if not (layer_re.search(k) and int(layer_re.search(k).group(1)) in gone)]
    for key in missing:
        problems.append(Problem("parameter transformers expects is not in the checkpoint",
                                file=where, field=key,
                                fix="re-export the checkpoint or correct config.json"))


def _ranges(numbers: list[int]) -> str:
    out, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(f"{start}" if start == n else f"{start}..{n}")
            start = None
    return ", ".join(out)


def _note_extras(ckpt: Checkpoint, model) -> None:
    extras = sorted(n for n, r in ckpt.roles.items() if r == "extra")
    if not extras:
        return
    params = sum(ckpt.tensors[n].numel for n in extras)
    severity, message = risk_text("extra_tensors", count=len(extras), params=f"{params:,}",
                                  example=extras[0], cls=type(model).__name__)
    layer_re = re.compile(data()["patterns"]["layer"])
    layers = sorted({int(m.group(1)) for n in extras if (m := layer_re.search(n))})
    limit = ckpt.config.get("num_hidden_layers")
    beyond = [i for i in layers if isinstance(limit, int) and i >= limit]
    if beyond:
        message += f"; layers {_ranges(beyond)} lie beyond num_hidden_layers={limit} (e.g. MTP)"
    ckpt.notes.append(Note("extra_tensors", severity, message,
                           ckpt.location(ckpt.tensors[extras[0]].file), extras[0]))


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


__all__ = ["match_model", "check_dtypes"]
