"""Recurrent state of state-space and linear-attention layers, in place of a KV cache.

Mamba, Mamba-2, Jamba, Bamba, Falcon-H1, Zamba, Nemotron-H, Granite-4 hybrid, LFM2 (short
convolution), Qwen3-Next and Kimi-Linear (linear attention), MiniMax (lightning attention): each
stateful layer keeps a state of fixed size per sequence, whatever the context. Its size is a
formula over config fields, per model_type, in day0/data/layer_state.yaml ``state`` (read off
each model's modeling code); a type without one, or a field that is not a number, gives null and
an ``unknown:`` note, never a guess.
"""

from __future__ import annotations

import ast
import operator

from pydantic import BaseModel, ConfigDict, Field

from day0.checkpoint.headers import data
from day0.stages.analysis.layouts import layer_state, note_unknown, number

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.FloorDiv: operator.floordiv}


class StateCache(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stateful_layers: int = Field(description="Layers holding a recurrent state.")
    attention_layers: int = Field(description="Layers holding a KV cache (hybrid layers hold both).")
    conv_elements_per_layer: int | None = Field(None, description=(
        "Convolution state per layer and sequence (elements); null: not derivable."))
    ssm_elements_per_layer: int | None = Field(None, description=(
        "Recurrent (SSM / linear-attention) state per layer and sequence (elements)."))
    bytes_per_sequence: dict[str, int] | None = Field(None, description=(
        "All stateful layers' state per sequence, per dtype; independent of context length."))
    shapes: str | None = Field(None, description="The state tensors' shapes per layer, in config fields.")


class _Unknown(Exception):
    """A name in a formula with no numeric value."""


def _evaluate(expr: str, values: dict, view):
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            value = values[node.id] if node.id in values else number(view.get(node.id))
            if value is None:
                raise _Unknown(node.id)
            return value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            right = walk(node.right)
            if isinstance(node.op, ast.FloorDiv) and right == 0:
                raise _Unknown(ast.unparse(node))
            return OPS[type(node.op)](walk(node.left), right)
        raise ValueError(f"layer_state.yaml: unsupported expression {expr!r}")
    result = walk(ast.parse(str(expr), mode="eval"))
    return int(result) if result == int(result) and result >= 0 else None


def state_sizes(view, spec: dict, unknown: list[str] | None) -> tuple[int | None, int | None]:
    """(conv, ssm) elements per layer by spec's formulas; None where a field is unknown."""
    values: dict = {}
    for name, alternatives in spec["values"].items():
        missing = None
        for alt in alternatives:
            try:
                values[name] = _evaluate(alt, values, view)
                break
            except _Unknown as exc:
                missing = missing or str(exc)
        else:
            raw = view.get(missing) if missing else None
            note_unknown(unknown, missing or name, "no numeric value" if raw is None
                         else f"not a number: {str(raw)[:40]!r}")
    out = []
    for key in ("conv", "ssm"):
        try:
            out.append(_evaluate(spec[key], values, view))
        except _Unknown:
            out.append(None)
    return out[0], out[1]


def state_facts(view, split: dict[str, int], unknown: list[str] | None = None) -> StateCache | None:
    """The recurrent state, or None for a model without stateful layers."""
    stateful = split.get("stateful", 0)
    if not stateful:
        return None
    model_type = getattr(view, "model_type", None) or view.raw.get("model_type")
    spec = layer_state()["state"].get(model_type)
    conv = ssm = None
    if spec is None:
        note_unknown(unknown, "recurrent state",
                     f"no state formula for model_type {model_type!r} in day0/data/layer_state.yaml")
    else:
        conv, ssm = state_sizes(view, spec, unknown)
    sizes = data()["dtype_bytes"]
    per_seq = (None if conv is None or ssm is None else
               {d: stateful * (conv + ssm) * sizes[d] for d in ("bfloat16", "float8", "float16",
                                                                 "float32")})
    return StateCache(stateful_layers=stateful, attention_layers=split["full"] + split["windowed"],
                      conv_elements_per_layer=conv, ssm_elements_per_layer=ssm,
                      bytes_per_sequence=per_seq, shapes=spec.get("shapes") if spec else None)


def shared_layers(view) -> str | None:
    """Parameters one block holds and several layers use (layer_state.yaml shared_layers)."""
    model_type = getattr(view, "model_type", None) or view.raw.get("model_type")
    return layer_state().get("shared_layers", {}).get(model_type)


__all__ = ["StateCache", "state_facts", "state_sizes", "shared_layers"]
