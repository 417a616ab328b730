"""Architecture facts for the analysis stage: attention, MoE, RoPE, parameters, memory, KV cache.

Everything here is arithmetic over config.json as transformers' class reads it (a
day0.checkpoint.configview.ConfigView: ``view.get(*names)``, ``view.raw``) and a list of ``(name, shape)``
tensors: the checkpoint's headers when weights exist, otherwise the parameters of transformers'
class built on the meta device in a child process. Formulas are in the docstrings; thresholds and
name patterns in data/analysis.yaml.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field

from day0.checkpoint.headers import data

DTYPES = ("bfloat16", "float8", "float16", "float32")


class Attention(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="mha, gqa, mqa or mla (multi-head latent attention).")
    num_heads: int = Field(description="Query heads.")
    num_kv_heads: int = Field(description="Key/value heads (MLA: equal to query heads).")
    head_dim: int = Field(description="Query/key head dimension (MLA: nope + rope parts).")
    v_head_dim: int = Field(description="Value head dimension.")
    kv_lora_rank: int | None = Field(None, description="MLA latent dimension that is cached.")
    q_lora_rank: int | None = Field(None, description="MLA query low-rank dimension.")
    qk_rope_head_dim: int | None = Field(None, description="MLA rope key dimension (cached).")
    sliding_window: int | None = Field(None, description="Window of sliding-window layers.")
    layer_types: dict[str, int] = Field(default_factory=dict, description="Layers per attention kind.")


class MoE(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_experts: int = Field(description="Routed experts per MoE layer.")
    experts_per_token: int = Field(description="Routed experts chosen per token (top-k).")
    shared_experts: int = Field(description="Always-active shared experts per MoE layer.")
    moe_layers: int = Field(description="Layers holding routed experts.")
    routed_params: int = Field(description="Parameters in routed experts, all layers.")
    scoring: str | None = Field(None, description="Router scoring function when not softmax.")
    n_group: int | None = Field(None, description="Expert groups for group-limited routing.")
    topk_group: int | None = Field(None, description="Groups chosen per token.")


class Rope(BaseModel):
    model_config = ConfigDict(extra="forbid")

    theta: float | None = Field(None, description="RoPE base frequency.")
    type: str = Field("default", description="Scaling type: default, linear, dynamic, yarn, llama3, ...")
    factor: float | None = Field(None, description="Context extension factor.")
    original_max_positions: int | None = Field(None, description="Pre-extension context length.")
    parameters: dict[str, Any] = Field(default_factory=dict, description="All RoPE parameters as given.")


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total: int = Field(description="Parameters transformers' class loads (MTP/extra tensors excluded).")
    active: int = Field(description="Per-token parameters: total - routed x (1 - k/E).")
    routed_experts: int = Field(0, description="Parameters in routed experts.")
    embedding: int = Field(0, description="Input embedding parameters.")
    unused: int = Field(0, description="Checkpoint parameters transformers' class does not use (e.g. MTP).")
    source: str = Field(description="'checkpoint' (header element counts) or 'config' (meta model).")


def cfg(view, *names, default=None):
    """First non-null of names as transformers' class reads config.json (day0.checkpoint.configview)."""
    return view.get(*names, default=default)


def cfg_alias(view, key: str, default=None):
    return cfg(view, *data()["config_fields"][key], default=default)


def attention_facts(view) -> Attention:
    heads = int(view.require("num_attention_heads"))
    kv = int(cfg(view, "num_key_value_heads", default=heads))
    hidden = int(view.require("hidden_size"))
    layer_types = cfg(view, "layer_types") or []
    counts: dict[str, int] = {}
    for kind in layer_types:
        counts[kind] = counts.get(kind, 0) + 1
    window = cfg(view, "sliding_window", "attention_chunk_size")
    if cfg(view, "kv_lora_rank"):
        rope = int(cfg(view, "qk_rope_head_dim", default=0))
        nope = int(cfg(view, "qk_nope_head_dim", default=0))
        return Attention(kind="mla", num_heads=heads, num_kv_heads=heads, head_dim=nope + rope,
                         v_head_dim=int(cfg(view, "v_head_dim", default=nope + rope)),
                         kv_lora_rank=int(cfg(view, "kv_lora_rank")),
                         q_lora_rank=cfg(view, "q_lora_rank"), qk_rope_head_dim=rope,
                         sliding_window=window, layer_types=counts)
    head_dim = int(cfg(view, "head_dim", default=hidden // heads))
    kind = "mqa" if kv == 1 else "mha" if kv == heads else "gqa"
    return Attention(kind=kind, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                     v_head_dim=head_dim, sliding_window=window, layer_types=counts)


def rope_facts(view) -> Rope | None:
    """transformers 5 keeps RoPE in rope_parameters; older config.json in rope_theta/rope_scaling."""
    params = dict(cfg(view, "rope_parameters") or {})
    scaling = view.raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", cfg(view, "rope_theta"))
    if theta is None and not params:
        return None
    kind = params.get("rope_type") or params.get("type") or "default"
    # reported as given; a value of the wrong type is left out (transformers ignores or refuses it)
    return Rope(theta=_number(theta), type=str(kind), factor=_number(params.get("factor")),
                original_max_positions=_number(params.get("original_max_position_embeddings"), int),
                parameters=params)


def _number(value, kind=float):
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if kind is int and not (math.isfinite(value) and value == int(value)):
        return None
    return kind(value)


def routed_expert_names(tensors: Iterable[tuple[str, tuple[int, ...]]], num_experts: int | None) -> set[str]:
    """Routed expert tensors: per-expert 'experts.N.' names, fused 'experts.gate_up_proj' [E, ...]
    tensors, and (fallback for other namings) 3-D tensors whose first dimension is E."""
    patterns = [re.compile(p) for p in data()["patterns"]["routed_expert"]]
    found = set()
    for name, shape in tensors:
        if any(p.search(name) for p in patterns):
            found.add(name)
        elif num_experts and len(shape) == 3 and shape[0] == num_experts and "shared" not in name:
            found.add(name)
    return found


def moe_facts(view, tensors: list[tuple[str, tuple[int, ...]]]) -> tuple[MoE | None, set[str]]:
    experts = cfg_alias(view, "num_experts")
    if not experts or int(experts) <= 1:
        return None, set()
    experts = int(experts)
    k = int(cfg_alias(view, "experts_per_token", default=1))
    shared = cfg_alias(view, "shared_experts")
    if shared is None:  # Qwen2-MoE style: one shared expert when it has a size
        shared = 1 if cfg(view, "shared_expert_intermediate_size") else 0
    routed = routed_expert_names(tensors, experts)
    layer_re = re.compile(data()["patterns"]["layer"])
    layers = {m.group(1) for n in routed if (m := layer_re.search(n))}
    sizes = dict(tensors)
    scoring = cfg(view, "scoring_func")
    return MoE(num_experts=experts, experts_per_token=k, shared_experts=int(shared),
               moe_layers=len(layers), routed_params=sum(math.prod(sizes[n]) for n in routed),
               scoring=None if scoring in (None, "softmax") else str(scoring),
               n_group=cfg(view, "n_group"), topk_group=cfg(view, "topk_group")), routed


def count_params(tensors: list[tuple[str, tuple[int, ...]]], moe: MoE | None, source: str,
                 unused: int = 0) -> Params:
    """total = sum of element counts; active = total - routed x (1 - k/E) (shared experts count fully)."""
    total = sum(math.prod(s) for _, s in tensors)
    routed = moe.routed_params if moe else 0
    active = total - round(routed * (1 - moe.experts_per_token / moe.num_experts)) if moe else total
    embedding = sum(math.prod(s) for n, s in tensors if "embed_tokens" in n)
    return Params(total=total, active=active, routed_experts=routed, embedding=embedding,
                  unused=unused, source=source)


def weights_bytes(tensors: list[tuple[str, tuple[int, ...]]]) -> dict[str, int]:
    """params x bytes per dtype. float8 follows fp8 releases such as DeepSeek-V3: matrices in 1 byte,
    embeddings, lm_head, router gates and norms kept in 2 bytes (block scales not included)."""
    sizes = data()["dtype_bytes"]
    total = sum(math.prod(s) for _, s in tensors)
    keep = [re.compile(p) for p in data()["patterns"]["fp8_keeps_16bit"]]
    wide = sum(math.prod(s) for n, s in tensors if len(s) < 2 or any(p.search(n) for p in keep))
    out = {d: total * sizes[d] for d in DTYPES if d != "float8"}
    out["float8"] = (total - wide) * sizes["float8"] + wide * sizes["bfloat16"]
    return {d: out[d] for d in DTYPES}


def layer_split(view, attention: Attention) -> dict[str, int]:
    """Decoder layers by KV behaviour: full (grows with context), windowed (capped), stateful (none)."""
    layers = int(view.require("num_hidden_layers"))
    if attention.layer_types:
        split = {"full": 0, "windowed": 0, "stateful": 0}
        for kind, n in attention.layer_types.items():
            key = ("full" if kind == "full_attention" else
                   "windowed" if kind in ("sliding_attention", "chunked_attention") else "stateful")
            split[key] += n
        if not attention.sliding_window:
            split["full"] += split.pop("windowed")
            split["windowed"] = 0
        return split
    windowed = attention.sliding_window and view.raw.get("use_sliding_window", True) is not False
    return {"full": 0 if windowed else layers, "windowed": layers if windowed else 0, "stateful": 0}


def kv_per_layer_token(attention: Attention) -> int:
    """Cached elements per token per layer: MLA caches the latent + rope key; others K and V."""
    if attention.kind == "mla":
        return attention.kv_lora_rank + attention.qk_rope_head_dim
    return attention.num_kv_heads * (attention.head_dim + attention.v_head_dim)


def kv_cache(attention: Attention, split: dict[str, int], max_context: int) -> dict:
    """bytes_per_token = cached elements x attention layers x bytes (standard: 2 x layers x
    kv_heads x head_dim x bytes; MLA: layers x (kv_lora_rank + qk_rope_head_dim) x bytes);
    at max context, windowed layers hold at most `sliding_window` tokens."""
    sizes = data()["dtype_bytes"]
    per = kv_per_layer_token(attention)
    window = min(attention.sliding_window or max_context, max_context)
    per_token, at_max = {}, {}
    for d in ("bfloat16", "float8", "float16", "float32"):
        b = sizes[d]
        per_token[d] = per * (split["full"] + split["windowed"]) * b
        at_max[d] = per * b * (split["full"] * max_context + split["windowed"] * window)
    formula = ("layers x (kv_lora_rank + qk_rope_head_dim) x bytes" if attention.kind == "mla"
               else "layers x kv_heads x (k_head_dim + v_head_dim) x bytes")
    return {"bytes_per_token": per_token, "bytes_at_max_context": at_max, "layers": split,
            "max_context": max_context, "formula": formula}


def mla_expanded_per_token(attention: Attention, layers: int) -> int:
    """bf16 bytes per token when MLA K/V are cached decompressed (transformers' eager cache)."""
    return layers * attention.num_heads * (attention.head_dim + attention.v_head_dim) * 2


__all__ = ["Attention", "MoE", "Rope", "Params", "cfg", "cfg_alias", "attention_facts",
           "rope_facts", "moe_facts", "routed_expert_names", "count_params", "weights_bytes",
           "layer_split", "kv_cache", "kv_per_layer_token", "mla_expanded_per_token", "DTYPES"]
