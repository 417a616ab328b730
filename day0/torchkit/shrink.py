"""Config shrinking: a copy of a transformers config with tiny dimensions and the same
architecture, options and every layer kind (dense/MoE, sliding/full attention), so a model can
be materialised with random weights in seconds to probe or replay its ops on a device."""

from __future__ import annotations

import copy

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
MOE_WIDTH_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size")
# Layer-pattern periods: the probe needs at least this many layers to contain each kind.
_PERIOD_KEYS = ("decoder_sparse_step", "moe_layer_freq", "full_attention_interval",
                "interleave_moe_layer_step")


def shrink_config(config, *, hidden: int, heads: int, intermediate: int, vocab: int,
                  max_layers: int):
    """A copy of a transformers config with tiny dims and the same architecture and options."""
    data = copy.deepcopy(config.to_dict())
    data.pop("quantization_config", None)  # random weights are plain tensors in the target dtype
    _shrink(data, hidden=hidden, heads=heads, intermediate=intermediate, vocab=vocab,
            max_layers=max_layers)
    if isinstance(data.get("text_config"), dict):
        _shrink(data["text_config"], hidden=hidden, heads=heads, intermediate=intermediate,
                vocab=vocab, max_layers=max_layers)
    small = type(config).from_dict(data)
    small._experts_implementation = config._experts_implementation
    small._attn_implementation = config._attn_implementation
    return small


def _shrink(d: dict, *, hidden, heads, intermediate, vocab, max_layers) -> None:
    old_layers = d.get("num_hidden_layers")
    if d.get("num_attention_heads"):
        ratio = max(1, d["num_attention_heads"] // (d.get("num_key_value_heads") or
                                                    d["num_attention_heads"]))
        d["num_attention_heads"] = heads
        if d.get("num_key_value_heads"):
            d["num_key_value_heads"] = max(1, heads // ratio)
    if "hidden_size" in d:
        d["hidden_size"] = hidden
    head_dim = max(8, hidden // heads)
    if "qk_rope_head_dim" in d:  # multi-head latent attention (DeepSeek-V2/V3, Kimi-K2)
        d.update(qk_rope_head_dim=8, qk_nope_head_dim=head_dim, v_head_dim=head_dim)
        if d.get("q_lora_rank"):
            d["q_lora_rank"] = 2 * head_dim
        if d.get("kv_lora_rank"):
            d["kv_lora_rank"] = 2 * head_dim
        if "qk_head_dim" in d:
            d["qk_head_dim"] = head_dim + 8
        if d.get("head_dim") is not None:
            d["head_dim"] = 8
    elif d.get("head_dim") is not None:
        d["head_dim"] = head_dim
    _shrink_rope_lists(d, d.get("head_dim") or head_dim)
    if "intermediate_size" in d:
        d["intermediate_size"] = intermediate
    for key in MOE_WIDTH_KEYS:
        if isinstance(d.get(key), int) and d[key] > 0:
            d[key] = max(8, intermediate // 4)
    _shrink_experts(d)
    if "vocab_size" in d:
        d["vocab_size"] = vocab
        for key in [k for k in d if k.endswith("token_id")]:  # ids beyond the tiny vocab
            if isinstance(d[key], int) and d[key] >= vocab:
                d[key] = None
            elif isinstance(d[key], list):
                d[key] = [i for i in d[key] if not isinstance(i, int) or i < vocab] or None
    if isinstance(old_layers, int):
        _shrink_layers(d, old_layers, max_layers)


def _shrink_rope_lists(d: dict, head_dim: int) -> None:
    """longrope factors have one entry per rotary frequency: cut them to the new head size."""
    rope = d.get("rope_parameters") or d.get("rope_scaling")
    if not isinstance(rope, dict):
        return
    half = max(1, int(head_dim * d.get("partial_rotary_factor", 1.0)) // 2)
    for key in ("short_factor", "long_factor"):
        if isinstance(rope.get(key), list):
            rope[key] = rope[key][:half]


def _shrink_experts(d: dict) -> None:
    top_k = d.get("num_experts_per_tok") or d.get("moe_topk") or 1
    key = next((k for k in EXPERT_COUNT_KEYS if isinstance(d.get(k), int) and d[k] > 0), None)
    if key is None:
        return
    experts = max(4, 2 * int(top_k))
    groups = d.get("n_group")
    if isinstance(groups, int) and groups > 1:  # group-limited routing (DeepSeek): keep it valid
        per_group = max(2, -(-experts // groups))
        while (d.get("topk_group") or groups) * per_group < top_k:
            per_group += 1
        experts = groups * per_group
    d[key] = min(d[key], experts)


def _shrink_layers(d: dict, old: int, max_layers: int) -> None:
    n = 2
    if isinstance(d.get("first_k_dense_replace"), int) and d["first_k_dense_replace"] > 0:
        d["first_k_dense_replace"] = 1  # layer 0 dense, layer 1 MoE
    for key in _PERIOD_KEYS:
        if isinstance(d.get(key), int) and d[key] > 1:
            n = max(n, d[key])
    if d.get("mlp_only_layers"):
        d["mlp_only_layers"] = [0]
    kinds = list(dict.fromkeys(d["layer_types"])) if isinstance(d.get("layer_types"), list) else []
    n = min(max(n, len(kinds)), max_layers, old)
    for key, value in list(d.items()):  # per-layer lists (layer_types, no_rope_layers, ...)
        if isinstance(value, list) and len(value) == old and key != "layer_types":
            d[key] = value[:n]
    if kinds:
        d["layer_types"] = [kinds[i % len(kinds)] for i in range(n)]
    d["num_hidden_layers"] = n
