"""RoPE per layer type and the layer layout: which layers are local, chunked, stateful or global.

Today's configs key ``rope_parameters`` by layer type (Gemma 3: ``{"full_attention": {...},
"sliding_attention": {...}}``), mix sliding, chunked, linear-attention and SSM layers, and leave
RoPE out of some layers (Llama 4's ``no_rope_layers``). Each fact here is read from the view
(day0.checkpoint.configview) and never guessed: a value of the wrong type becomes None and an
``unknown: <field> (<why>)`` entry in the ``unknown`` list the caller passes (analysis turns those
into risks). What a layer kind caches is data: day0/data/layer_state.yaml ``layer_kinds``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from day0 import DATA_DIR

LAYER_STATE = DATA_DIR / "layer_state.yaml"
# each RoPE variant's own parameters (list-valued ones are reported by length)
VARIANT_KEYS = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate",
                "low_freq_factor", "high_freq_factor", "short_factor", "long_factor", "short_mscale",
                "long_mscale", "mrope_section", "mrope_interleaved")
LONG_LISTS = ("short_factor", "long_factor")


@lru_cache(maxsize=1)
def layer_state() -> dict:
    """day0/data/layer_state.yaml (layer kinds, state formulas, shared layers)."""
    return yaml.safe_load(LAYER_STATE.read_text(encoding="utf-8"))


def note_unknown(unknown: list[str] | None, field: str, why: str) -> None:
    if unknown is not None and not any(u.startswith(f"unknown: {field} ") for u in unknown):
        unknown.append(f"unknown: {field} ({why})")


def number(value, kind=float):
    """value as kind, or None when it is not a finite number of that kind (bools are not)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if not math.isfinite(value) and kind is int:
        return None
    if kind is int and value != int(value):
        return None
    return kind(value)


def checked(view, name: str, unknown, kind=int, *names: str):
    """A config field as kind; a value of another type is None and noted as unknown."""
    value = view.get(name, *names)
    if value is None:
        return None
    found = number(value, kind)
    if found is None or (kind is int and found < 0):
        note_unknown(unknown, name, f"not a {'non-negative integer' if kind is int else 'number'}: "
                                    f"{str(value)[:40]!r}")
        return None
    return found


# --------------------------------------------------------------------------- RoPE

class RopeSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    theta: float | None = Field(None, description="RoPE base frequency (null: not derivable).")
    type: str = Field("default", description="Scaling type: default, linear, dynamic, yarn, llama3, "
                                             "longrope, su, mrope, ...")
    factor: float | None = Field(None, description="Context extension factor.")
    original_max_positions: int | None = Field(None, description="Pre-extension context length.")
    variant: dict[str, Any] = Field(default_factory=dict, description=(
        "The variant's own parameters: beta_fast/beta_slow (yarn), low/high_freq_factor (llama3), "
        "short/long_factor lengths (longrope, su), mrope_section (mrope), ..."))


def rope_section(params: dict, theta_default=None, unknown=None, where: str = "rope_parameters"
                 ) -> RopeSection:
    theta_raw = params.get("rope_theta", theta_default)
    theta = number(theta_raw)
    if theta_raw is not None and theta is None:
        note_unknown(unknown, f"{where}.rope_theta", f"not a number: {str(theta_raw)[:40]!r}")
    kind = params.get("rope_type") or params.get("type") or "default"
    if "mrope_section" in params and kind == "default":
        kind = "mrope"  # multimodal RoPE: sections of the rotary dims per position axis
    variant = {}
    for key in VARIANT_KEYS:
        if key not in params:
            continue
        value = params[key]
        variant[key if key not in LONG_LISTS else f"{key}_len"] = (
            len(value) if key in LONG_LISTS and isinstance(value, (list, tuple)) else value)
    found = {}
    for key, kind_of in (("factor", float), ("original_max_position_embeddings", int)):
        found[key] = number(params.get(key), kind_of)
        if params.get(key) is not None and found[key] is None:
            note_unknown(unknown, f"{where}.{key}", f"not a number: {str(params[key])[:40]!r}")
    return RopeSection(theta=theta, type=str(kind), factor=found["factor"],
                       original_max_positions=found["original_max_position_embeddings"],
                       variant=variant)


def rope_dicts(view, unknown=None) -> tuple[dict, dict[str, dict]]:
    """(flat RoPE parameters, per-layer-type sections) as config.json and the class give them;
    rope_scaling first, rope_parameters over it, as transformers reads them."""
    params: dict = {}
    for name, value in (("rope_scaling", view.raw.get("rope_scaling")),
                        ("rope_parameters", view.get("rope_parameters"))):
        if value is None:
            continue
        if not isinstance(value, dict):
            note_unknown(unknown, name, f"not a mapping: {str(value)[:40]!r}")
            continue
        params.update(value)
    nested = {k: v for k, v in params.items() if isinstance(v, dict)}
    return {k: v for k, v in params.items() if k not in nested}, nested


def no_rope_layers(view, unknown=None) -> list[int]:
    """Layers that apply no RoPE: ``no_rope_layers[i] == 0`` (Llama 4, SmolLM3; 1 = RoPE), or
    when only ``no_rope_layer_interval`` is given, every interval-th layer as the class derives it."""
    flags = view.get("no_rope_layers")
    layers = view.get("num_hidden_layers")
    if flags is None:
        interval = view.get("no_rope_layer_interval")
        if number(interval, int) and number(layers, int) is not None and interval > 0:
            return [i for i in range(int(layers)) if (i + 1) % interval == 0]
        return []
    if not isinstance(flags, list) or not all(number(f, int) in (0, 1) for f in flags):
        note_unknown(unknown, "no_rope_layers", "not a list of 0/1 flags")
        return []
    return [i for i, f in enumerate(flags) if not f]


# --------------------------------------------------------------------------- layer layout

def layer_kinds(view, unknown=None) -> list[str] | None:
    """Each decoder layer's kind from layer_types (or its alias), None when the config gives none."""
    kinds = view.get("layer_types")
    if kinds is None:
        return None
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        note_unknown(unknown, "layer_types", "not a list of names")
        return None
    return kinds


def layout_summary(kinds: list[str]) -> str | None:
    """The shortest repeating pattern, e.g. '5 sliding_attention + 1 full_attention, repeating
    every 6 layers'; None for a single kind."""
    if len(set(kinds)) < 2:
        return None
    period = next(p for p in range(1, len(kinds) + 1)
                  if all(kinds[i] == kinds[i % p] for i in range(len(kinds))))
    if period > len(kinds) // 2 and period > 8:
        return None  # a long irregular layout: the indices say it
    runs: list[list] = []
    for kind in kinds[:period]:
        if runs and runs[-1][1] == kind:
            runs[-1][0] += 1
        else:
            runs.append([1, kind])
    return (" + ".join(f"{n} {k}" for n, k in runs)
            + (f", repeating every {period} layers" if period < len(kinds) else "")
            + ("" if len(kinds) % period == 0 else f" ({len(kinds)} layers: the last pattern cut)"))


def cache_class(kind: str) -> str | None:
    """full, window, chunk, state, hybrid or none (layer_state.yaml); None: a kind day0 lacks."""
    return layer_state()["layer_kinds"].get(kind)


def attention_free(view) -> bool:
    model_type = getattr(view, "model_type", None) or view.raw.get("model_type")
    return model_type in layer_state()["attention_free"] and view.get("num_attention_heads") is None


def layer_split(view, attention, unknown=None) -> dict[str, int]:
    """Decoder layers by KV behaviour: full (grows with context), windowed (capped by the sliding
    window or attention chunk), stateful (a recurrent state; hybrid layers count as full and
    stateful), no_cache (MLP-only layers; present only when there are some)."""
    layers = number(view.require("num_hidden_layers"), int) or 0
    split = {"full": 0, "windowed": 0, "stateful": 0}
    if attention.kind == "none":
        split["stateful"] = layers
        return split
    if not attention.layer_types:
        windowed = attention.sliding_window and view.raw.get("use_sliding_window", True) is not False
        split["windowed" if windowed else "full"] = layers
        return split
    for kind, n in attention.layer_types.items():
        cls = cache_class(kind)
        if cls is None:
            note_unknown(unknown, f"layer kind {kind!r}",
                         "no cache rule in day0/data/layer_state.yaml; counted as full attention")
            cls = "full"
        if cls in ("window", "chunk"):
            cap = attention.sliding_window if cls == "window" else attention.chunk_size
            if not cap and kind != "sliding_attention":  # transformers itself drops a null window
                note_unknown(unknown, "sliding_window" if cls == "window" else "attention_chunk_size",
                             f"{kind} layers without one; counted as full attention")
            split["windowed" if cap else "full"] += n
        elif cls in ("full", "hybrid"):
            split["full"] += n
        if cls in ("state", "hybrid"):
            split["stateful"] += n
        if cls == "none":
            split["no_cache"] = split.get("no_cache", 0) + n
    return split


__all__ = ["RopeSection", "rope_section", "rope_dicts", "no_rope_layers", "layer_kinds",
           "layout_summary", "cache_class", "attention_free", "layer_split", "layer_state",
           "note_unknown", "number", "checked"]
