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

import re
import time
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from day0.errors import TargetFault
from day0.torchkit.opcapture import COMPOSITES, OpRecorder, op_names
from day0.torchkit.shrink import EXPERT_COUNT_KEYS, MOE_WIDTH_KEYS, shrink_config

LOW_PRECISION = (torch.bfloat16, torch.float16)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


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
        raise TargetFault(f"target device '{device}' is not usable here ({one_line(exc)})",
                         field="device", fix="run the scan where that device exists, or give the "
                         "target an op_manifest listing its supported ops") from None


def run_probe(resolved, *, device: str, dtype: torch.dtype, plugins: list[str], hidden: int,
              heads: int, intermediate: int, vocab: int, max_layers: int, seq_len: int,
              seed: int = 0) -> Probe:
    """Build the shrunk model on the device, apply plugins, run one forward under the probe."""
    from day0.checkpoint.modeling import config_for_class, quiet_transformers
    from day0.execution.plugins import apply_plugins

    start = time.perf_counter()
    _check_device(device)
    small = shrink_config(resolved.config, hidden=hidden, heads=heads, intermediate=intermediate,
                          vocab=vocab, max_layers=max_layers)
    small = config_for_class(small, resolved.model_class)
    torch.manual_seed(seed)
    with quiet_transformers():
        model = resolved.model_class._from_config(small, dtype=dtype)
    model = model.to(device).eval()
    apply_plugins(model, plugins)
    text = small.get_text_config()
    described = text.to_dict()
    dims = {k: described[k] for k in (
        "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
        "intermediate_size", "vocab_size", *EXPERT_COUNT_KEYS, *MOE_WIDTH_KEYS,
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
