"""Full-size forward pass on the meta device, recording every aten op (no weights, no memory).

Meta tensors have shapes but no values, so data-dependent code (``.item()``, ``nonzero``, loops
over the experts that were hit, packed-sequence checks on position ids) cannot run as is. Two
things keep the forward going:

* shadows: small meta tensors whose values follow from the inputs alone (input ids, ``arange``
  positions, masks built from them) carry a real CPU copy, computed alongside; data-dependent
  ops on them get their true answer (e.g. the causal-mask path is the real one);
* synthetic answers: a data-dependent op on a value that depends on the (absent) weights gets a
  documented assumption (``nonzero``: a few hits, so a loop over the experts that were hit runs a
  few times, dispatching the same ops as a real run; ``.item()``: False for conditions, 1 for
  counts; a copy to the CPU: ones) and the assumption is reported as a note. Op counts are therefore those of this assumed routing.

An op that still cannot run stops the forward; the ops seen until then are kept and the failing
op is reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map

from day0.torchkit.opcapture import OpRecorder, op_names

SHADOW = "_day0_shadow"
aten = torch.ops.aten


class DataDependentOpError(RuntimeError):
    """A data-dependent op that has no meta kernel and no synthetic rule."""

    def __init__(self, op: str, error: str):
        self.op, self.error = op, error
        super().__init__(f"{op}: {error}")


def _shadow_of(t: torch.Tensor):
    return getattr(t, SHADOW, None) if t.device.type == "meta" else t


def _to_cpu_call(value):
    """Replace meta tensors by their shadows and meta devices by cpu."""
    if isinstance(value, torch.Tensor):
        return _shadow_of(value)
    if isinstance(value, torch.device) and value.type == "meta":
        return torch.device("cpu")
    return value


def _meta_like(value):
    return value.to("meta") if isinstance(value, torch.Tensor) else value


class MetaScanRecorder(OpRecorder):
    """OpRecorder for meta-device forwards: shadows for input-derived values, synthetic answers."""

    def __init__(self, *, shadow_numel: int = 1 << 16, nonzero_rows: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.shadow_numel = shadow_numel
        self.nonzero_rows = nonzero_rows
        self.assumptions: set[tuple[str, str]] = set()   # (op, what was assumed)

    def call(self, func, args, kwargs):
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_meta = any(t.device.type == "meta" for t in tensors) or _device_kwarg_is_meta(kwargs)
        if not on_meta:
            return func(*args, **kwargs)
        shadowed = all(_shadow_of(t) is not None for t in tensors)
        try:
            out = func(*args, **kwargs)
        except Exception as exc:  # no meta kernel: data-dependent op, or a picky meta kernel
            if shadowed:
                cpu_out = self._shadow_call(func, args, kwargs)
                if cpu_out is not None:
                    if _leaves_meta(func, args, kwargs):  # e.g. .cpu(): the values are real
                        return cpu_out
                    return self._attach(tree_map(_meta_like, cpu_out), cpu_out)
            retried = self._retry_bf16(func, args, kwargs)
            if retried is not None:
                return retried
            return self._synthesise(func, args, kwargs, exc)
        if shadowed and self._small(out):
            cpu_out = self._shadow_call(func, args, kwargs)
            if cpu_out is not None:
                self._attach(out, cpu_out)
                return out
        self._drop_mutated_shadows(func, args, kwargs)
        return out

    def call_composite(self, func, args, kwargs):
        """The meta decomposition of a composite (SDPA: the math path's bmm, softmax, masks) is
        not what devices run, so it is not recorded; the probe records the device's kernels."""
        if func is not torch.nn.functional.scaled_dot_product_attention:
            try:
                with _disable_current_modes():
                    return func(*args, **kwargs)
            except Exception:  # data-dependent inside: run it recorded, with the usual rules
                return func(*args, **kwargs)
        # Attention output in the (batch, seq, heads, dim) memory layout fused kernels return,
        # so the model's transpose+contiguous after it costs no copy, as on a device.
        query, value = args[0], (args[2] if len(args) > 2 else kwargs["value"])
        *batch, heads, seq, _ = query.shape
        with _disable_current_modes():
            out = torch.empty((*batch, seq, heads, value.shape[-1]), dtype=query.dtype,
                              device=query.device)
            return out.transpose(-3, -2)

    # -- shadows -------------------------------------------------------------------------------
    def _small(self, out) -> bool:
        leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return all(t.numel() <= self.shadow_numel for t in leaves)

    @staticmethod
    def _shadow_call(func, args, kwargs):
        try:
            return func(*tree_map(_to_cpu_call, list(args)), **tree_map(_to_cpu_call, kwargs))
        except Exception:  # a shadow is an optimisation; without one the op stays meta-only
            return None

    @staticmethod
    def _attach(meta_out, cpu_out):
        metas, cpus = tree_leaves(meta_out), tree_leaves(cpu_out)
        if len(metas) == len(cpus):
            for m, c in zip(metas, cpus):
                if isinstance(m, torch.Tensor) and m.device.type == "meta" and \
                        isinstance(c, torch.Tensor):
                    setattr(m, SHADOW, c)
        return meta_out

    @staticmethod
    def _drop_mutated_shadows(func, args, kwargs):
        """An in-place op with an unshadowed input leaves the written tensor's shadow stale."""
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for t in tree_leaves(value):
                if isinstance(t, torch.Tensor) and hasattr(t, SHADOW):
                    delattr(t, SHADOW)

    def _retry_bf16(self, func, args, kwargs):
        """Some meta kernels mirror one device's dtype limits (``_grouped_mm``: bfloat16 only);
        the output shape does not depend on the dtype, so take it from a bfloat16 run."""
        floats = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
                  and t.is_floating_point() and t.dtype != torch.bfloat16]
        if not floats or func._schema.is_mutable:
            return None

        def cast(t):
            return t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and \
                t.is_floating_point() else t
        try:
            out = func(*tree_map(cast, list(args)), **tree_map(cast, kwargs))
        except Exception:
            return None
        self._assume(func, f"meta kernel rejects {floats[0].dtype}; output shape taken from a "
                           "bfloat16 call")
        return tree_map(lambda t: t.to(floats[0].dtype) if isinstance(t, torch.Tensor) and
                        t.is_floating_point() else t, out)

    # -- synthetic answers for weight-dependent values -----------------------------------------
    def _nonzero(self, x: torch.Tensor) -> torch.Tensor:
        # Few rows: every loop iteration dispatches the same ops, so more rows only cost time.
        rows = min(x.numel(), self.nonzero_rows)
        return torch.empty((rows, x.dim()), dtype=torch.long, device="meta")

    def _assume(self, func, text: str) -> None:
        self.assumptions.add((op_names(func)[0], text))

    def _synthesise(self, func, args, kwargs, exc: Exception):
        if func is aten._local_scalar_dense.default:
            dtype = args[0].dtype
            # False: weight-dependent conditions mostly guard special cases (a sentinel expert,
            # NaN checks); 1: counts and indices, so loops run and index 1 exists in MoE tables.
            value = False if dtype == torch.bool else (1.0 if dtype.is_floating_point else 1)
            self._assume(func, f".item() of a weight-dependent value taken as {value!r}")
            return value
        if _leaves_meta(func, args, kwargs):
            self._assume(func, "weight-dependent values copied off meta taken as ones (counts "
                               "of 1, flags set)")
            with _disable_current_modes():
                if func is aten.copy_.default:
                    return args[0].fill_(1)
                if func is aten._to_copy.default:
                    return torch.ones(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype,
                                      device=kwargs["device"])
        if func is aten.nonzero.default:
            self._assume(func, f"weight-dependent: {self.nonzero_rows} hits assumed (a loop over "
                               f"hit experts visits {self.nonzero_rows} experts per layer)")
            return self._nonzero(args[0])
        if func is aten.masked_select.default:
            self._assume(func, f"weight-dependent mask: {self.nonzero_rows} elements assumed selected")
            size = torch.Size(torch.broadcast_shapes(args[0].shape, args[1].shape)).numel()
            return torch.empty(min(size, self.nonzero_rows), dtype=args[0].dtype, device="meta")
        if func is aten.index.Tensor and any(
                i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            self._assume(func, f"weight-dependent boolean index: {self.nonzero_rows} hits assumed")
            indices = []
            for i in args[1]:
                if i is not None and i.dtype in (torch.bool, torch.uint8):
                    indices.extend(self._nonzero(i).unbind(1))
                else:
                    indices.append(i)
            return func(args[0], indices)
        if func is aten.repeat_interleave.Tensor:
            self._assume(func, "every repeat count taken as 1")
            return torch.empty(args[0].numel(), dtype=args[0].dtype, device="meta")
        if func is aten.equal.default:
            self._assume(func, "torch.equal of weight-dependent values taken as False")
            return False
        raise DataDependentOpError(op_names(func)[0], f"{type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc


def _leaves_meta(func, args, kwargs) -> bool:
    """The op writes its result off the meta device (``.cpu()``, ``.to(device)``, ``copy_``)."""
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device).type != "meta"
    return func is aten.copy_.default and args[0].device.type != "meta"


def _device_kwarg_is_meta(kwargs) -> bool:
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "meta"


@dataclass
class MetaScan:
    """Outcome of one meta-device forward."""

    recorder: MetaScanRecorder
    params: int
    seconds: float
    error: str | None = None          # why the forward stopped early, if it did
    failed_op: str | None = None      # the aten op it stopped at, when it was an op
    notes: list[str] = field(default_factory=list)


def _layer_progress(model, recorder) -> list:
    """Forward hooks saying how many decoder layers the full-size forward has passed (and the
    op calls recorded so far); they read counters only, never a tensor."""
    from day0.execution import progress
    from day0.checkpoint.modeling import decoder_layers

    try:
        layers = decoder_layers(model)
    except Exception:  # no .model.layers: no layer progress, the scan is the same
        return []

    def after(index: int):
        def hook(module, args, output):
            calls = sum(s.count for s in recorder.ops.values())
            progress.update("layers", index + 1, len(layers),
                            detail=f"{calls} aten op calls recorded")
        return hook

    return [layer.register_forward_hook(after(i)) for i, layer in enumerate(layers)]


def meta_scan(resolved, *, dtype: torch.dtype, seq_len: int, batch: int = 1,
              experts_implementation: str | None = None, attn_implementation: str | None = None,
              before_forward=None) -> MetaScan:
    """Build the model at full size on meta and record one forward of batch x seq_len tokens.

    ``before_forward(model)`` runs on the built model first (the checkpoint's names and shapes
    are compared with it there: one model for both, and a mismatch stops before the forward).
    Target plugins are not applied here: they are written for a model with weights (and a
    fault-injecting one would stop the scan); the probe runs them, and ops a plugin replaces show
    up as unprobed there rather than silently covered.
    """
    from day0.checkpoint.modeling import build_meta_model

    start = time.perf_counter()
    config = resolved.config
    for built in {id(c): c for c in (config, resolved.class_config)}.values():
        if experts_implementation is not None:
            built._experts_implementation = experts_implementation
        if attn_implementation is not None:
            built._attn_implementation = attn_implementation
    model = build_meta_model(resolved, dtype=dtype)
    if before_forward is not None:
        before_forward(model)
    notes = list(resolved.notes)
    quant = getattr(config, "quantization_config", None)
    if quant:
        method = quant.get("quant_method") if isinstance(quant, dict) else type(quant).__name__
        notes.append(f"quantization_config ({method}) not applied: the ops are those of the "
                     f"model in {str(dtype).removeprefix('torch.')}; quantized kernels are not "
                     "scanned")
    params = sum(p.numel() for p in model.parameters())
    vocab = int(getattr(config, "vocab_size", 0) or getattr(config.get_text_config(), "vocab_size"))
    ids_cpu = (torch.arange(batch * seq_len) % vocab).reshape(batch, seq_len)
    ids = ids_cpu.to("meta")
    setattr(ids, SHADOW, ids_cpu)
    recorder = MetaScanRecorder()
    error = failed = None
    hooks = _layer_progress(model, recorder)
    try:
        with torch.no_grad(), recorder:
            model(input_ids=ids, use_cache=False)
    except DataDependentOpError as exc:
        error, failed = exc.error, exc.op
    except Exception as exc:  # model code may fail outside any op (e.g. a device check)
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        failed = recorder.last_op
    finally:
        for hook in hooks:
            hook.remove()
    notes += [f"{op}: {text}" for op, text in sorted(recorder.assumptions)]
    return MetaScan(recorder, params, time.perf_counter() - start, error, failed, notes)

