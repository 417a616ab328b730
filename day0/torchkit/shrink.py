"""Config shrinking: a copy of a transformers config with tiny dimensions and the same
architecture, options and every layer kind (dense/MoE, sliding/full attention), so a model can
be materialised with random weights in seconds to probe or replay its ops on a device."""

from __future__ import annotations

import copy
import math
import warnings

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "moe_k", "num_experts_per_token", "moe_top_k")
MOE_WIDTH_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size")
# Layer-pattern periods: the probe needs at least this many layers to contain each kind.
_PERIOD_KEYS = ("decoder_sparse_step", "moe_layer_freq", "full_attention_interval",
                "interleave_moe_layer_step")
# The names _shrink sizes; older configs spell them their own way (GPT-2's n_embd, n_head,
# n_layer), which the config class's attribute_map translates.
_CANONICAL = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
              "intermediate_size", "vocab_size", "head_dim", "moe_intermediate_size",
              "layer_types")
# Repeating layer-kind patterns (RecurrentGemma's block_types): layer i is pattern[i % len]
_PATTERN_KEYS = ("block_types",)
# FFN widths no attribute_map names (None means "4 x hidden" and is left alone)
_FFN_WIDTH_KEYS = ("n_inner", "dff", "ffn_dim", "ffn_hidden_size", "d_ff", "inner_size")
# Sub-configs of a tower besides the language model (vision, audio, ...): shrunk by the same
# rules on their own sizes, so a multimodal class builds tiny as a whole
TOWER_KEYS = ("vision_config", "audio_config", "speech_config", "vq_config",
              "depth_decoder_config", "encoder_config", "image_config", "audio_encoder_config",
              "perceiver_config", "decoder_config", "global_config", "patcher_config")
# Layers of each kind a class needs (default 1), where one layer of a kind does not build: Zamba
# ties every hybrid layer's shared block to the first one's, and its tie pattern finds no second
# one to tie. Not a property the config shows, hence by model type.
_MIN_PER_KIND = {"zamba": 2}


def shrink_config(config, *, hidden: int, heads: int, intermediate: int, vocab: int,
                  max_layers: int):
    """A copy of a transformers config with tiny dims and the same architecture and options."""
    data = copy.deepcopy(config.to_dict())
    data.pop("quantization_config", None)  # random weights are plain tensors in the target dtype
    _as_loaded_layout(data, config)
    dims = dict(hidden=hidden, heads=heads, intermediate=intermediate, vocab=vocab,
                max_layers=max_layers, min_per_kind=_MIN_PER_KIND.get(config.model_type, 1))
    attribute_map = getattr(type(config), "attribute_map", {})

    def sizes() -> dict:  # the model's own sizes, for sub-configs that repeat them
        return {name: data.get(name, data.get(attribute_map.get(name, name)))
                for name in _CANONICAL}

    before = sizes()
    _shrink_aliased(data, attribute_map, dims)
    after = sizes()
    _shrink_sub_configs(data, before, after, dims)
    text = getattr(config, "text_config", None)
    widths = (before["hidden_size"], after["hidden_size"])  # the language model's
    if isinstance(data.get("text_config"), dict):
        text_hidden = data["text_config"].get("hidden_size")
        _shrink_aliased(data["text_config"], getattr(type(text), "attribute_map", {}), dims)
        widths = (text_hidden, data["text_config"].get("hidden_size")) if text_hidden else widths
    for key in TOWER_KEYS:
        if isinstance(data.get(key), dict):
            _shrink_tower(data[key], getattr(config, key, None), widths, dims)
    small = _rederived(type(config).from_dict(data), config)
    small._experts_implementation = config._experts_implementation
    small._attn_implementation = config._attn_implementation
    return small


def _as_loaded_layout(data: dict, config) -> None:
    """Dory's to_dict writes the released layout (each layer as an attention and an "mlp" block,
    every layer count doubled) that __post_init__ halves on load: shrink the loaded layout, which
    from_dict takes as it is, so the shrunk counts are never halved (nor the pairs broken)."""
    loaded = getattr(config, "layer_types", None)
    if not isinstance(loaded, list) or not isinstance(data.get("layer_types"), list) \
            or loaded == data["layer_types"]:
        return
    data["layer_types"] = list(loaded)
    for key, value in list(data.items()):
        if "layers" in key and isinstance(value, int) and not isinstance(value, bool):
            data[key] = getattr(config, key, value)


def _shrink_sub_configs(data: dict, before: dict, after: dict, dims: dict) -> None:
    """Sub-configs as dicts (DBRX's attn_config and ffn_config): one that sizes the same
    residual stream (its hidden_size is the model's) is shrunk by the same rules; a head count
    the model takes from one (DBRX's kv_n_heads) follows the model's, so the two still agree."""
    for key, sub in data.items():
        if not (key.endswith("_config") and key != "text_config" and isinstance(sub, dict)):
            continue
        if before["hidden_size"] and sub.get("hidden_size") == before["hidden_size"]:
            _shrink_aliased(sub, {}, dims)
        for name, value in sub.items():
            if not isinstance(value, int) or isinstance(value, bool) or "heads" not in name:
                continue
            kv = "kv" in name or "key_value" in name
            for size in ("num_key_value_heads",) if kv else ("num_attention_heads",):
                if before[size] == value and isinstance(after[size], int):
                    sub[name] = after[size]


def _shrink_tower(sub: dict, tower, widths: tuple, dims: dict) -> None:
    """A tower's own sizes shrunk by the same rules; a width that joins it to itself or to the
    language model (Dots-3's adapter_in_dim and adapter_out_dim) follows the size it equals;
    widths is the language model's hidden size before and after its shrink."""
    own = sub.get("hidden_size")
    _shrink_aliased(sub, getattr(type(tower), "attribute_map", {}), dims)
    for name, value in list(sub.items()):
        if name == "hidden_size" or not isinstance(value, int) or isinstance(value, bool):
            continue
        if own and value == own:
            sub[name] = sub["hidden_size"]
        elif widths[0] and value == widths[0]:
            sub[name] = widths[1]


def _rederived(small, original):
    """Sizes the class derives from others in __post_init__ (RecurrentGemma's lru_width, xLSTM's
    embedding_dim, Zamba2's attention_hidden_size) keep the original's value through from_dict:
    each such field (one the class gives the original's value when it is left out) is derived
    again by the class from the shrunk fields. Fields given explicitly stay as they are."""
    from day0.checkpoint.modeling import quiet_transformers

    before, shrunk = original.to_dict(), small.to_dict()
    cls = type(original)

    def without(d: dict, keys: set):
        try:
            with quiet_transformers(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return cls.from_dict({k: v for k, v in d.items() if k not in keys})
        except Exception:  # noqa: BLE001 - a class that needs the field: not derived
            return None

    derived = set()
    for key, value in shrunk.items():
        if key.startswith("_") or before.get(key) != value or isinstance(value, bool) \
                or not isinstance(value, (int, float, list)):
            continue  # changed by the shrink, or not a size
        probe = without(before, {key})
        if probe is not None and read_attribute(probe, key) == value:
            derived.add(key)  # what the class computes when it is left out
    again = without(shrunk, derived) if derived else None
    for key in derived if again is not None else ():
        value = read_attribute(again, key)
        if value is not None and value != shrunk[key]:
            setattr(small, key, value)
    return small


def read_attribute(config, name: str, default=None):
    """getattr that a config refusing a global read answers with the default."""
    try:
        return getattr(config, name, default)
    except Exception:  # noqa: BLE001 - per-layer attributes (Dots-3, Gemma-4) refuse a global read
        return default


def _shrink_aliased(d: dict, attribute_map: dict, dims: dict) -> None:
    """_shrink on the canonical names, each aliased field renamed there and back."""
    renamed = {name: attribute_map[name] for name in _CANONICAL
               if name not in d and attribute_map.get(name) in d}
    for name, alias in renamed.items():
        d[name] = d.pop(alias)
    _shrink(d, **dims)
    for name, alias in renamed.items():
        d[alias] = d.pop(name)
    _shrink_extras(d, **{k: v for k, v in dims.items() if k != "min_per_kind"})


def _shrink_extras(d: dict, *, hidden, heads, intermediate, vocab, max_layers) -> None:
    """Sizes that only some families have: FFN widths of older configs, a second attention
    kind's heads (swa_/global_ prefixes), XLNet's d_head, Mamba-2 heads, extra vocabularies."""
    head_dim = max(8, hidden // heads)
    for key in _FFN_WIDTH_KEYS:
        if isinstance(d.get(key), int) and d[key] > 0:
            d[key] = intermediate
    for prefix in ("swa_", "global_", "local_", "sliding_", "full_"):
        if isinstance(d.get(prefix + "num_attention_heads"), int):
            kv = d.get(prefix + "num_key_value_heads")
            ratio = max(1, d[prefix + "num_attention_heads"] // kv) if isinstance(kv, int) and kv else 1
            d[prefix + "num_attention_heads"] = heads
            if isinstance(kv, int) and kv:
                d[prefix + "num_key_value_heads"] = max(1, heads // ratio)
        if isinstance(d.get(prefix + "head_dim"), int):
            d[prefix + "head_dim"] = 2 * head_dim if prefix in ("global_", "full_") else head_dim
    group = max(1, heads // (d.get("num_key_value_heads") or heads))
    for key in ("index_n_heads", "index_num_heads"):  # sparse-attention indexers
        if isinstance(d.get(key), int):
            d[key] = min(d[key], group)
    if isinstance(d.get("d_head"), int):  # XLNet checks d_head == d_model // n_head
        d["d_head"] = hidden // heads
    _shrink_ssm_heads(d, hidden)
    if isinstance(d.get("num_layers_per_stack"), int):
        # HRM: two stacks of this many layers, run H x (L + 1) times; num_hidden_layers counts
        # those runs (cache slots), as the config's __post_init__ computes it
        d["num_layers_per_stack"] = min(d["num_layers_per_stack"], max_layers)
        runs = (d.get("H_cycles") or 1) * ((d.get("L_cycles") or 0) + 1)
        d["num_hidden_layers"] = d["num_layers_per_stack"] * runs
    if isinstance(d.get("hidden_size_per_layer_input"), int) and d["hidden_size_per_layer_input"]:
        d["hidden_size_per_layer_input"] = 16  # Gemma-3n/4 per-layer embeddings
    for key in [k for k in d if "vocab_size" in k and k != "vocab_size"]:
        if isinstance(d[key], int) and d[key] > vocab:  # per-layer inputs, unpadded, ...
            d[key] = vocab


def _shrink_ssm_heads(d: dict, hidden: int) -> None:
    """Mamba-2 heads must tile expand x hidden exactly, and the groups must divide the heads."""
    for n_key, dim_key, expand_key, groups_key in (
            ("mamba_n_heads", "mamba_d_head", "mamba_expand", "mamba_n_groups"),
            ("num_heads", "head_dim", "expand", "n_groups")):
        if not all(isinstance(d.get(k), (int, float)) for k in (n_key, expand_key)):
            continue
        inner = int(d[expand_key] * hidden)
        if isinstance(d.get("mamba_d_ssm"), int):  # Falcon-H1 names the inner size itself
            d["mamba_d_ssm"] = inner
        d_head = 16 if isinstance(d.get(dim_key), int) else inner // d[n_key]
        if isinstance(d.get(dim_key), int):
            d[dim_key] = d_head
        d[n_key] = max(1, inner // d_head)
        if isinstance(d.get(groups_key), int) and d[n_key] % d[groups_key]:
            d[groups_key] = math.gcd(d[n_key], d[groups_key])


def _shrink(d: dict, *, hidden, heads, intermediate, vocab, max_layers, min_per_kind=1) -> None:
    old_layers = d.get("num_hidden_layers")
    original = dict(d)  # top-level sizes before, for per-layer overrides
    _shrink_hidden_splits(d, hidden)
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
            d["head_dim"] = 8  # the rotary width (DeepSeek); _mla_head_dim below for the others
    elif d.get("head_dim") is not None:
        d["head_dim"] = head_dim
    _shrink_rope_lists(d, d.get("head_dim") or head_dim)
    if isinstance(d.get("rotary_dim"), int) and original.get("hidden_size"):
        # GPT-J / CodeGen rotate the first rotary_dim of each head: the same share of the new one
        was = original["hidden_size"] // (original.get("num_attention_heads") or 1)
        d["rotary_dim"] = max(2, head_dim * d["rotary_dim"] // max(1, was) // 2 * 2)
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
                d[key] = vocab - 1  # not None: some configs require an int
            elif isinstance(d[key], list):
                d[key] = [i for i in d[key] if not isinstance(i, int) or i < vocab] or None
    if isinstance(old_layers, int):
        _shrink_layers(d, old_layers, max_layers, original, min_per_kind)
    if "qk_rope_head_dim" in d and d.get("head_dim") is not None:
        d["head_dim"] = _mla_head_dim(d, original)


def _shrink_hidden_splits(d: dict, hidden: int) -> None:
    """Lists of sizes that split the hidden size (Reformer's axial_pos_embds_dim, which must sum
    to it): the same shares of the new one."""
    was = d.get("hidden_size")
    for key, value in d.items():
        if "dim" in key and isinstance(was, int) and isinstance(value, list) and len(value) > 1 \
                and all(isinstance(v, int) and v > 0 for v in value) and sum(value) == was:
            parts = [max(1, v * hidden // was) for v in value]
            parts[-1] += hidden - sum(parts)
            d[key] = parts


def _mla_head_dim(d: dict, original: dict) -> int:
    """MLA's head_dim is one of its query/key widths: the rotary part alone (DeepSeek), or the
    rotary plus the non-rotary part, of the model or of the layers a per-layer override gives
    their own width (Dots-3's sliding layers, validated so): the same one, shrunk."""
    def qk(c: dict, base: dict) -> int:
        return c.get("qk_nope_head_dim", base.get("qk_nope_head_dim", 0)) + \
            c.get("qk_rope_head_dim", base.get("qk_rope_head_dim", 0))

    was = original.get("head_dim")
    if was == qk(original, original):
        return qk(d, d)
    overrides = original.get("per_layer_config")
    for override in overrides.values() if isinstance(overrides, dict) else ():
        if isinstance(override, dict) and "head_dim" not in override \
                and was == qk(override, original):
            return qk(_shrunk_override(d, original, override), d)
    return d["head_dim"]


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
    top_k = next((d[k] for k in _TOP_K_KEYS if isinstance(d.get(k), int) and d[k] > 0), 1)
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


def _shrink_layers(d: dict, old: int, max_layers: int, original: dict,
                   min_per_kind: int = 1) -> None:
    n = 2
    for key in ("first_k_dense_replace", "num_dense_layers"):  # LFM2-MoE's, AFMoE's name
        if isinstance(d.get(key), int) and d[key] > 0:
            d[key] = 1  # layer 0 dense, layer 1 MoE
    for key in _PERIOD_KEYS:
        if isinstance(d.get(key), int) and d[key] > 1:
            n = max(n, d[key])
    # Jamba places kinds by offset and period; a config that also lists each layer's kind
    # (Zamba's layers_block_type) follows its list
    listed = any(isinstance(v, list) and len(v) == old and all(isinstance(x, str) for x in v)
                 for v in d.values())
    for key in [k for k in d if k.endswith("_layer_offset") and not listed]:
        period = d.get(key.removesuffix("offset") + "period")
        if isinstance(d[key], int) and isinstance(period, int) and 0 <= d[key] < period:
            if d[key] >= max_layers:  # its first place out of reach: the same kind, sooner
                d[key] = max_layers - 1
                d[key.removesuffix("offset") + "period"] = max_layers
            n = max(n, d[key] + 1)
    for key in _PATTERN_KEYS:  # enough layers to reach each kind's first place in the pattern
        if isinstance(d.get(key), list) and d[key]:
            n = max(n, max(d[key].index(kind) for kind in d[key]) + 1)
    if d.get("mlp_only_layers"):
        d["mlp_only_layers"] = [0]
    old_types = d["layer_types"] if isinstance(d.get("layer_types"), list) else []
    kinds = list(dict.fromkeys(old_types))
    n = max(n, min_per_kind * len(kinds))
    parts = _layer_partition(d, old)
    n = max(n, len(parts))
    if isinstance(d.get("num_kv_shared_layers"), int) and d["num_kv_shared_layers"] > 0:
        # the last layers reuse earlier layers' KV cache: each kind must come before them too
        n = max(n, 2 * len(kinds))
        d["num_kv_shared_layers"] = max(1, len(kinds))
    n = min(n, max_layers, old)
    per_layer = [k for k, v in d.items() if isinstance(v, list) and len(v) == old]
    for key in per_layer:  # per-layer lists (layer_types, no_rope_layers, ...)
        if key != "layer_types":
            d[key] = d[key][:n]
    new_types = [kinds[i % len(kinds)] for i in range(n)] if kinds else []
    if kinds:
        d["layer_types"] = new_types
    _remap_layer_indices(d, old, n, old_types, new_types, skip=set(per_layer),
                         original=original)
    if parts:
        d.update(zip(parts, _split(n, [d[k] for k in parts])))
    d["num_hidden_layers"] = n


def _layer_partition(d: dict, old: int) -> list[str]:
    """Counts of consecutive layer sections that the config checks sum to the layer count
    (Dory's n_input_layers + n_recurrent_layers + n_output_layers)."""
    keys = [k for k, v in d.items() if k != "num_hidden_layers" and k.endswith("_layers")
            and k.startswith(("n_", "num_")) and isinstance(v, int) and not isinstance(v, bool)
            and v > 0]
    return keys if len(keys) > 1 and sum(d[k] for k in keys) == old else []


def _split(n: int, sizes: list[int]) -> list[int]:
    """n split in the proportions of sizes, each part at least 1 (n >= len(sizes))."""
    total = sum(sizes)
    parts = [max(1, s * n // total) for s in sizes]
    while sum(parts) != n:  # the rounding, given to (or taken from) the largest part
        i = parts.index(max(parts))
        parts[i] += 1 if sum(parts) < n else -1
    return parts


def _remap_layer_indices(d: dict, old: int, n: int, old_types: list, new_types: list, *,
                         skip: set, original: dict) -> None:
    """Lists of layer indices (index_layers, full_attn_idxs) and per-layer overrides keyed by
    index (per_layer_config): an old layer stands as every new layer of its kind, else as the
    last new layer, so every special layer kind stays (and stays homogeneous)."""
    def new_indices(i: int) -> list[int]:
        if i < len(old_types) and old_types[i] in new_types:
            return [j for j, kind in enumerate(new_types) if kind == old_types[i]]
        return [min(i, n - 1)]

    for key, value in list(d.items()):
        if (key != "mlp_only_layers" and key not in skip and ("layer" in key or "idx" in key)
                and isinstance(value, list) and 0 < len(value) < old
                and all(isinstance(i, int) and 0 <= i < old for i in value)
                and value == sorted(set(value))):
            d[key] = sorted({j for i in value for j in new_indices(i)})
    overrides = d.get("per_layer_config")
    if isinstance(overrides, dict) and overrides and all(str(k).isdigit() for k in overrides):
        width = max(len(str(k)) for k in overrides)
        remapped: dict = {}
        for key, value in overrides.items():
            for j in new_indices(int(key)):
                remapped.setdefault(str(j).zfill(width), _shrunk_override(d, original, value))
        d["per_layer_config"] = remapped


def _shrunk_override(d: dict, original: dict, value):
    """A layer's own sizes, shrunk: twice, half or the same as the shrunk model's, as the
    override was against the original model's."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for key, size in value.items():
        new, was = d.get(key), original.get(key)
        if isinstance(size, int) and isinstance(new, int) and isinstance(was, int):
            out[key] = 2 * new if size > was else max(1, new // 2) if size < was else new
    return out
