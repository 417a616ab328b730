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
from day0.stages.analysis.layouts import (RopeSection, attention_free, checked, layer_kinds,
                                          layer_split, layout_summary, no_rope_layers, note_unknown,
                                          number, rope_dicts, rope_section)

DTYPES = ("bfloat16", "float8", "float16", "float32")


class Attention(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="mha, gqa, mqa, mla (multi-head latent attention) or none "
                                  "(attention-free: every layer a state-space layer).")
    num_heads: int = Field(description="Query heads (0: attention-free).")
    num_kv_heads: int = Field(description="Key/value heads (MLA: equal to query heads).")
    head_dim: int = Field(description="Query/key head dimension (MLA: nope + rope parts).")
    v_head_dim: int = Field(description="Value head dimension.")
    kv_lora_rank: int | None = Field(None, description="MLA latent dimension that is cached.")
    q_lora_rank: int | None = Field(None, description="MLA query low-rank dimension.")
    qk_rope_head_dim: int | None = Field(None, description="MLA rope key dimension (cached).")
    index_n_heads: int | None = Field(None, description="DSA (DeepSeek sparse attention) indexer heads.")
    index_head_dim: int | None = Field(None, description=(
        "DSA indexer head dimension; its single-head key is cached per token next to the latent."))
    index_topk: int | None = Field(None, description="DSA: tokens each query attends to.")
    sliding_window: int | None = Field(None, description="Window of sliding-window layers.")
    chunk_size: int | None = Field(None, description=(
        "attention_chunk_size of chunked-attention layers (Llama 4): they attend within a chunk."))
    layer_types: dict[str, int] = Field(default_factory=dict, description="Layers per attention kind.")
    layer_indices: dict[str, list[int]] = Field(default_factory=dict, description=(
        "Layer indices per kind, when the layers are of more than one kind."))
    layout: str | None = Field(None, description=(
        "The layers' repeating pattern, e.g. '5 sliding_attention + 1 full_attention, repeating "
        "every 6 layers'; null for one kind or no repeat (layer_indices say it)."))


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


class Rope(RopeSection):
    """The model's RoPE: one section (the full-attention layers' when RoPE is keyed by layer
    type), each layer type's, and what applies to all of them."""

    theta: float | None = Field(None, description=(
        "RoPE base frequency; with per-layer-type RoPE, the full-attention layers' (else the "
        "first type's). null: not derivable (see the unknown risks)."))
    per_layer_type: dict[str, RopeSection] = Field(default_factory=dict, description=(
        "RoPE of each layer type when config.json keys rope_parameters by layer type (Gemma 3: "
        "full_attention and sliding_attention with their own theta)."))
    partial_rotary_factor: float | None = Field(None, description=(
        "Share of each head's dimensions that is rotated (null: all)."))
    no_rope_layers: list[int] = Field(default_factory=list, description=(
        "Layers that apply no RoPE (Llama 4's NoPE layers)."))
    parameters: dict[str, Any] = Field(default_factory=dict, description="All RoPE parameters as given.")


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total: int = Field(description="Parameters transformers' class loads (MTP/extra tensors excluded).")
    active: int = Field(description="Per-token parameters: total - routed x (1 - k/E).")
    routed_experts: int = Field(0, description="Parameters in routed experts.")
    embedding: int = Field(0, description="Input embedding parameters.")
    unused: int = Field(0, description="Checkpoint parameters transformers' class does not use (e.g. MTP).")
    buffers: int = Field(0, description=(
        "Elements of persistent buffers the checkpoint stores besides the parameters (DeepSeek's "
        "router e_score_correction_bias): not in total, as the class holds them as buffers."))
    source: str = Field(description="'checkpoint' (header element counts) or 'config' (meta model).")
    tied_embeddings: bool | None = Field(None, description=(
        "tie_word_embeddings: lm_head is the input embedding, not stored (counted once)."))
    shared_layers: str | None = Field(None, description=(
        "Blocks whose weights several layers share (e.g. Zamba's shared transformer block)."))


def cfg(view, *names, default=None):
    """First non-null of names as transformers' class reads config.json (day0.checkpoint.configview)."""
    return view.get(*names, default=default)


def cfg_alias(view, key: str, default=None):
    return cfg(view, *data()["config_fields"][key], default=default)


def attention_facts(view, unknown: list[str] | None = None) -> Attention:
    """Heads, head sizes, MLA/DSA latent sizes and the layer layout; a field of the wrong type is
    None (or the class's fallback) and noted in unknown."""
    kinds = layer_kinds(view, unknown)
    counts: dict[str, int] = {}
    for kind in kinds or []:
        counts[kind] = counts.get(kind, 0) + 1
    layout = {"sliding_window": checked(view, "sliding_window", unknown),
              "chunk_size": checked(view, "attention_chunk_size", unknown), "layer_types": counts,
              "layer_indices": ({k: [i for i, x in enumerate(kinds) if x == k] for k in counts}
                                if len(counts) > 1 else {}),
              "layout": layout_summary(kinds) if kinds else None}
    if attention_free(view):
        return Attention(kind="none", num_heads=0, num_kv_heads=0, head_dim=0, v_head_dim=0,
                         **layout)
    heads = int(view.require("num_attention_heads"))
    kv = checked(view, "num_key_value_heads", unknown) or heads
    hidden = int(view.require("hidden_size"))
    index = {"index_n_heads": checked(view, "index_n_heads", unknown),
             "index_head_dim": checked(view, "index_head_dim", unknown),
             "index_topk": checked(view, "index_topk", unknown)}
    if cfg(view, "kv_lora_rank"):
        rope = checked(view, "qk_rope_head_dim", unknown) or 0
        nope = checked(view, "qk_nope_head_dim", unknown) or 0
        return Attention(kind="mla", num_heads=heads, num_kv_heads=heads, head_dim=nope + rope,
                         v_head_dim=checked(view, "v_head_dim", unknown) or nope + rope,
                         kv_lora_rank=checked(view, "kv_lora_rank", unknown),
                         q_lora_rank=checked(view, "q_lora_rank", unknown), qk_rope_head_dim=rope,
                         **index, **layout)
    head_dim = checked(view, "head_dim", unknown) or hidden // heads
    kind = "mqa" if kv == 1 else "mha" if kv == heads else "gqa"
    return Attention(kind=kind, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                     v_head_dim=head_dim, **layout)


def rope_facts(view, unknown: list[str] | None = None) -> Rope | None:
    """transformers 5 keeps RoPE in rope_parameters (flat, or keyed by layer type); older
    config.json in rope_theta/rope_scaling. The top-level figures summarise the full-attention
    layers' RoPE (else the first type's), so they are never null where a layer type has one."""
    flat, nested = rope_dicts(view, unknown)
    theta = flat.get("rope_theta", cfg(view, "rope_theta"))
    if isinstance(theta, dict):  # some classes keep a theta per layer type in rope_theta
        nested = nested or {k: {"rope_theta": v} for k, v in theta.items()}
        theta = None
    if theta is None and not flat and not nested:
        return None
    per_type = {k: rope_section({**flat, **v}, theta, unknown, f"rope_parameters.{k}")
                for k, v in nested.items()}
    # the summary: full attention's, else the first type that has a theta
    ranked = sorted(per_type.items(), key=lambda kv: (kv[1].theta is None, kv[0] != "full_attention",
                                                      kv[0]))
    main = ranked[0][1] if ranked else rope_section(flat, theta, unknown)
    partial = next((p for p in [flat.get("partial_rotary_factor"),
                                *(v.get("partial_rotary_factor") for v in nested.values()),
                                cfg(view, "partial_rotary_factor")] if p is not None), None)
    if partial is not None and number(partial) is None:
        note_unknown(unknown, "partial_rotary_factor", f"not a number: {str(partial)[:40]!r}")
    return Rope(theta=main.theta, type=main.type, factor=main.factor,
                original_max_positions=main.original_max_positions, variant=main.variant,
                per_layer_type=per_type, partial_rotary_factor=number(partial),
                no_rope_layers=no_rope_layers(view, unknown), parameters={**flat, **nested})


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
    if not routed and not any("expert" in name.lower() for name, _ in tensors):
        # the config names experts, yet no tensor is one (e.g. every layer of a shrunk
        # DeepSeek dense by first_k_dense_replace): the model runs dense, no routing to judge
        return None, set()
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


def kv_per_layer_token(attention: Attention) -> int:
    """Cached elements per token per layer: MLA caches the latent + rope key (DSA also its
    indexer's single-head key); others K and V."""
    if attention.kind == "mla":
        return attention.kv_lora_rank + attention.qk_rope_head_dim + (attention.index_head_dim or 0)
    return attention.num_kv_heads * (attention.head_dim + attention.v_head_dim)


def kv_cache(attention: Attention, split: dict[str, int], max_context: int) -> dict:
    """bytes_per_token = cached elements x attention layers x bytes (standard: 2 x layers x
    kv_heads x head_dim x bytes; MLA: layers x (kv_lora_rank + qk_rope_head_dim [+ DSA
    index_head_dim]) x bytes); at max context a sliding layer holds at most its window and a
    chunked layer its chunk (per_layer_type says which holds what)."""
    sizes = data()["dtype_bytes"]
    per = kv_per_layer_token(attention)
    groups = _kv_groups(attention, split, max_context)
    per_token, at_max = {}, {}
    for d in DTYPES:
        b = sizes[d]
        per_token[d] = per * (split["full"] + split["windowed"]) * b
        at_max[d] = per * b * sum(g["layers"] * g["tokens_held"] for g in groups.values())
    formula = ("layers x (kv_lora_rank + qk_rope_head_dim" + (" + index_head_dim" if
                                                              attention.index_head_dim else "")
               + ") x bytes" if attention.kind == "mla"
               else "layers x kv_heads x (k_head_dim + v_head_dim) x bytes")
    for g in groups.values():
        g["bytes_at_max_context"] = {d: per * sizes[d] * g["layers"] * g["tokens_held"]
                                     for d in DTYPES}
    return {"bytes_per_token": per_token, "bytes_at_max_context": at_max, "layers": split,
            "max_context": max_context, "formula": formula, "per_layer_type": groups}


def _kv_groups(attention: Attention, split: dict[str, int], max_context: int) -> dict:
    """Attention layers by what they hold at max context: full (every token), sliding (the
    window), chunked (the chunk)."""
    window = min(attention.sliding_window or max_context, max_context)
    chunk = min(attention.chunk_size or max_context, max_context)
    kinds = attention.layer_types
    chunked = kinds.get("chunked_attention", 0) if attention.chunk_size else 0
    sliding = split["windowed"] - chunked
    groups = {"full": {"layers": split["full"], "tokens_held": max_context},
              "sliding": {"layers": sliding, "tokens_held": window},
              "chunked": {"layers": chunked, "tokens_held": chunk}}
    return {k: g for k, g in groups.items() if g["layers"]}


def mla_expanded_per_token(attention: Attention, layers: int) -> int:
    """bf16 bytes per token when MLA K/V are cached decompressed (transformers' eager cache)."""
    return layers * attention.num_heads * (attention.head_dim + attention.v_head_dim) * 2


__all__ = ["Attention", "MoE", "Rope", "RopeSection", "Params", "cfg", "cfg_alias", "attention_facts",
           "rope_facts", "moe_facts", "routed_expert_names", "count_params", "weights_bytes",
           "layer_split", "kv_cache", "kv_per_layer_token", "mla_expanded_per_token", "DTYPES"]
