"""Probe which aten ops the target runs: a tiny copy of the model, real weights, on the device.

The config is shrunk (same architecture and options, tiny dims, enough layers for every layer
kind), materialised with random weights in the target dtype on the target device, the target's
plugins applied, and one forward run under :class:`ProbeRecorder`: each op is called on the
device; one that raises is *uncovered* (its error kept) and is computed on CPU in float32
instead and moved back, so the rest of the forward is still probed. If even that fails (the
target is the CPU itself) a torch decomposition is tried; failing that the probe stops and the
ops it never reached stay unprobed.
"""

from __future__ import annotations

import copy
import re
import time
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from day0.errors import StageError
from day0.opcapture import COMPOSITES, OpRecorder, op_names

LOW_PRECISION = (torch.bfloat16, torch.float16)
_EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
_MOE_WIDTH_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size")
# Layer-pattern periods: the probe needs at least this many layers to contain each kind.
_PERIOD_KEYS = ("decoder_sparse_step", "moe_layer_freq", "full_attention_interval",
                "interleave_moe_layer_step")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# -- config shrinking -------------------------------------------------------------------------
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
    for key in _MOE_WIDTH_KEYS:
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
    key = next((k for k in _EXPERT_COUNT_KEYS if isinstance(d.get(k), int) and d[k] > 0), None)
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


# -- the dispatch mode ------------------------------------------------------------------------
class ProbeAborted(RuntimeError):
    """An op failed on the target and could not be computed on CPU either."""

    def __init__(self, op: str, error: str):
        self.op, self.error = op, error
        super().__init__(f"{op}: {error}")


def _op_device(args, kwargs) -> torch.device | None:
    for t in tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            return t.device
    device = kwargs.get("device")
    return torch.device(device) if device is not None else None


def _to_cpu32(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        return x.float() if x.dtype in LOW_PRECISION else x
    if isinstance(x, torch.device):
        return torch.device("cpu")
    return x


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def cpu_fallback(func, args: tuple, kwargs: dict):
    """Run one op on CPU in float32 and return its result as if it had run where args live."""
    device = _op_device(args, kwargs)
    low = next((t.dtype for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor) and t.dtype in LOW_PRECISION), None)
    try:
        expected = func(*tree_map(_to_meta, list(args)), **tree_map(_to_meta, kwargs))
    except Exception:  # no meta kernel: fall back to the dtype heuristic below
        expected = None
    cargs, ckwargs = tree_map(_to_cpu32, list(args)), tree_map(_to_cpu32, kwargs)
    try:
        out = func(*cargs, **ckwargs)
    except Exception:
        from torch._decomp import decomposition_table

        if func not in decomposition_table:
            raise
        out = decomposition_table[func](*cargs, **ckwargs)
    mutated = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        orig = args[i] if i < len(args) else kwargs.get(arg.name)
        new = cargs[i] if i < len(cargs) else ckwargs.get(arg.name)
        for o, n in zip(tree_leaves(orig), tree_leaves(new)):
            if isinstance(o, torch.Tensor) and o is not n:
                o.copy_(n.to(o.device, o.dtype))
        mutated.append(orig)
    if mutated and any(r.alias_info is not None for r in func._schema.returns):
        return mutated[0] if len(func._schema.returns) == 1 else tuple(mutated)
    flat, spec = tree_flatten(out)
    want = tree_leaves(expected) if expected is not None else []
    if len(want) != len(flat):
        want = [None] * len(flat)
    result = []
    for t, w in zip(flat, want):
        if isinstance(t, torch.Tensor):
            dtype = w.dtype if isinstance(w, torch.Tensor) else (
                low if low is not None and t.dtype == torch.float32 else t.dtype)
            t = t.to(device=device or t.device, dtype=dtype)
        result.append(t)
    return tree_unflatten(result, spec)


class ProbeRecorder(OpRecorder):
    """OpRecorder that treats an op raising on the device as uncovered and keeps going."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.failures: dict[str, str] = {}   # op name -> first error on the target

    def call(self, func, args, kwargs):
        try:
            return func(*args, **kwargs)
        except Exception as exc:  # any failure of a kernel = the target lacks this op
            name = op_names(func)[0]
            self.failures.setdefault(name, one_line(exc))
            try:
                return cpu_fallback(func, args, kwargs)
            except Exception as again:
                raise ProbeAborted(name, f"no CPU float32 fallback either ({one_line(again)})"
                                   ) from exc

    def call_composite(self, func, args, kwargs):
        """A composite can fail before reaching any kernel (SDPA: 'no available kernel')."""
        try:
            return func(*args, **kwargs)
        except ProbeAborted:
            raise
        except Exception as exc:
            name = COMPOSITES[func][0]
            self.failures.setdefault(name, one_line(exc))
            overload = getattr(getattr(torch.ops.aten, name.split(".")[1]), name.split(".")[2])
            try:
                with _disable_current_modes():  # the fallback's CPU ops are not the target's
                    return cpu_fallback(overload, args, kwargs)
            except Exception as again:
                raise ProbeAborted(name, f"no CPU float32 fallback either ({one_line(again)})"
                                   ) from exc


# -- running the probe ------------------------------------------------------------------------
@dataclass
class Probe:
    recorder: ProbeRecorder
    dims: dict
    seconds: float
    error: str | None = None                             # why the forward stopped early
    blamed: dict[str, str] = field(default_factory=dict)  # op -> error, from an escaped error


def _check_device(device: str) -> None:
    try:
        torch.empty(1, device=device)
    except Exception as exc:
        raise StageError(f"target device '{device}' is not usable here ({one_line(exc)})",
                         field="device", fix="run the scan where that device exists, or give the "
                         "target an op_manifest listing its supported ops") from None


def run_probe(resolved, *, device: str, dtype: torch.dtype, plugins: list[str], hidden: int,
              heads: int, intermediate: int, vocab: int, max_layers: int, seq_len: int,
              seed: int = 0) -> Probe:
    """Build the shrunk model on the device, apply plugins, run one forward under the probe."""
    from day0.modeling import quiet_transformers
    from day0.plugins import apply_plugins

    start = time.perf_counter()
    _check_device(device)
    small = shrink_config(resolved.config, hidden=hidden, heads=heads, intermediate=intermediate,
                          vocab=vocab, max_layers=max_layers)
    torch.manual_seed(seed)
    with quiet_transformers():
        model = resolved.model_class._from_config(small, dtype=dtype)
    model = model.to(device).eval()
    apply_plugins(model, plugins)
    text = small.get_text_config()
    described = text.to_dict()
    dims = {k: described[k] for k in (
        "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
        "intermediate_size", "vocab_size", *_EXPERT_COUNT_KEYS, *_MOE_WIDTH_KEYS,
        "num_experts_per_tok", "first_k_dense_replace") if isinstance(described.get(k), int)}
    ids = torch.randint(0, text.vocab_size, (1, seq_len)).to(device)
    recorder = ProbeRecorder()
    error, blamed = None, {}
    try:
        with torch.no_grad(), recorder:
            model(input_ids=ids, use_cache=False)
    except ProbeAborted as exc:
        error = f"probe stopped at {exc}"
    except Exception as exc:  # raised above our mode (e.g. a plugin's own dispatch mode)
        error = f"probe stopped: {one_line(exc)}"
        blamed = {m: one_line(exc) for m in _named_ops(str(exc))}
    return Probe(recorder, dims, time.perf_counter() - start, error, blamed)


def _named_ops(message: str) -> set[str]:
    """'aten::mm' / 'aten::mm.default' named in an error: backends name the missing kernel."""
    return {f"aten.{name}" + (f".{overload}" if overload else "")
            for name, overload in re.findall(r"aten::(\w+)(?:\.(\w+))?", message)}
