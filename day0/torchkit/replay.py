"""Per-operator check: replay every aten op the reference model ran, on the target.

The reference model runs a short real input under :class:`day0.torchkit.opcapture.OpRecorder`, which
keeps the first call's inputs of each op. Each op is then replayed twice from those inputs:

* target: floating tensors cast to the target dtype, everything moved to the target device;
* reference: the same op in float32 on CPU. By default (``reference_inputs="rounded"``) the
  reference inputs are first rounded to the target dtype, so both sides see identical values and
  the difference is the kernel's own error (input quantization is what the layer and logit
  checks measure). Discrete ops always use rounded inputs, so exact comparison is meaningful.

Outputs are compared with the tolerances of the op's kind (day0/data/tolerances.yaml); integer
and boolean outputs exactly; index outputs of argmax/topk/sort-like ops accept ties. Ops that
cannot be replayed are listed as skipped, each with its reason.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch.utils._pytree import tree_flatten, tree_map

from day0.execution import progress
from day0.execution.contract import Row
from day0.torchkit.dtypes import torch_dtype
from day0.torchkit.tolerances import Tolerances

Status = Literal["ok", "failed", "error", "skipped"]
# Ops whose integer outputs are positions into `self` along `dim`: a differing index that
# points at an equal value is a tie, not a mismatch.
INDEX_OPS = {"argmax", "argmin", "max", "min", "topk", "sort", "argsort", "kthvalue", "mode",
             "median", "nanmedian"}


class OpRow(Row):
    op: str = Field(description="aten overload, e.g. aten.mm.default.")
    kind: str = Field(description="elementwise, accumulate, discrete, uninitialized or random.")
    calls: int = Field(description="Calls in the reference forward.")
    module: str | None = Field(None, description="Model module the op was first seen in.")
    status: Status = Field(description="ok, failed (outside tolerance), error (target raised), "
                                       "skipped (not replayable; see reason).")
    elements: int | None = Field(None, description="Output elements compared.")
    mismatched: int | None = Field(None, description="Output elements outside tolerance.")
    max_abs_error: float | None = Field(None, description="Largest |target - reference|.")
    tolerance_ratio: float | None = Field(
        None, description="Largest |t-r| / allowed error; above 1 fails.")
    reason: str | None = Field(None, description="Why skipped/error, or what mismatched.")


def resolve_op(name: str):
    """torch.ops.<ns>.<op>.<overload> from 'aten.mm.default'."""
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def _bind(func, args, kwargs) -> dict:
    bound = {}
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _rounded(value, dtype):
    """Floating tensors rounded to dtype and back to float32, on CPU (fresh copies)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            return value.to(dtype).to(torch.float32, copy=True)
        return value.clone()
    return value


def _in_range(value, dtype):
    """A Python float beyond dtype's finite range, clamped to it (an infinity stays)."""
    if isinstance(value, float) and dtype.is_floating_point and math.isfinite(value):
        big = torch.finfo(dtype).max
        return max(-big, min(big, value))
    return value


def _to_reference(value):
    if isinstance(value, torch.Tensor):
        return value.to(torch.float32, copy=True) if value.is_floating_point() else value.clone()
    return value


def _to_target(value, device, dtype):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            return value.to(device=device, dtype=dtype, copy=True)
        return value.to(device=device, copy=True)
    if isinstance(value, torch.device):
        return torch.device(device)
    return value


def _compare_leaf(r, t, tol, exact: bool, index_ctx) -> tuple[int, int, float, float, str | None]:
    """(elements, mismatched, max_abs, tolerance_ratio, problem) for one output leaf."""
    if isinstance(r, torch.Tensor) != isinstance(t, torch.Tensor):
        return 1, 1, math.nan, math.inf, "output types differ"
    if not isinstance(r, torch.Tensor):
        r, t = torch.tensor(r), torch.tensor(t)
    t = t.detach().to("cpu")
    if r.shape != t.shape:
        return max(r.numel(), 1), max(r.numel(), 1), math.nan, math.inf, \
            f"shape {tuple(t.shape)} != reference {tuple(r.shape)}"
    if r.numel() == 0:
        return 0, 0, 0.0, 0.0, None
    if not r.is_floating_point() and not r.is_complex():
        bad = r != t.to(r.dtype)
        if bool(bad.any()) and index_ctx is not None and _ties(r, t, *index_ctx):
            bad = torch.zeros_like(bad)
        n_bad = int(bad.sum())
        diff = (r.double() - t.double()).abs().max().item() if r.dtype != torch.bool \
            else float(n_bad > 0)
        return r.numel(), n_bad, diff, math.inf if n_bad else 0.0, None
    r = r.double()
    t = t.double()
    same_nonfinite = (torch.isnan(r) & torch.isnan(t)) | ((r == t) & torch.isinf(r))
    finite_r = r[torch.isfinite(r)]
    scale = finite_r.abs().max().item() if finite_r.numel() else 0.0
    if exact:
        allowed = torch.zeros_like(r)
    else:
        allowed = tol.atol + tol.rtol * r.abs() + tol.scale_atol * scale
    err = (t - r).abs()
    err = torch.where(same_nonfinite, torch.zeros_like(err), err)
    # NaN errors (target NaN where the reference is not) must count as mismatches.
    bad = ~(err <= allowed)
    ratio = torch.where(allowed > 0, err / allowed, torch.where(err > 0, math.inf, 0.0))
    ratio = torch.where(torch.isnan(err), math.inf, ratio)
    max_abs = err.max().item()
    return r.numel(), int(bad.sum()), max_abs, ratio.max().item(), None


def _ties(r_idx, t_idx, x, dim) -> bool:
    """True when the target's indices select the same values of x as the reference's."""
    try:
        if dim is None:
            flat = x.reshape(-1)
            return torch.equal(flat[r_idx.reshape(-1)], flat[t_idx.to(torch.int64).reshape(-1)])
        dim = dim % x.dim() if x.dim() else 0
        if r_idx.dim() < x.dim():  # keepdim=False
            r_idx, t_idx = r_idx.unsqueeze(dim), t_idx.unsqueeze(dim)
        return torch.equal(x.gather(dim, r_idx.to(torch.int64)),
                           x.gather(dim, t_idx.to(torch.int64)))
    except (RuntimeError, IndexError):
        return False


def replay_op(name: str, stats, example, *, device: str, dtype: str, tolerances: Tolerances,
              reference_inputs: str, ran_at: set[str] | None = None) -> OpRow:
    packet = stats.packet.split(".", 1)[-1]
    kind = tolerances.op_kind(packet)
    row = dict(op=name, kind=kind, calls=stats.count, module=stats.module)
    if kind == "uninitialized":
        return OpRow(**row, status="skipped", reason="output is uninitialized memory (no value "
                                                       "to compare)")
    if kind == "random":
        return OpRow(**row, status="skipped", reason="output is random")
    if example is None:
        return OpRow(**row, status="skipped", reason="no example kept (over the recorder's "
                                                       "max_example_bytes)")
    args, kwargs = example
    leaves, _ = tree_flatten((args, kwargs))
    if any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in leaves):
        return OpRow(**row, status="skipped", reason="recorded on the meta device (no data)")
    try:
        func = resolve_op(name)
    except (AttributeError, ValueError) as exc:
        return OpRow(**row, status="skipped", reason=f"cannot resolve the op: {exc}")
    target_dtype = torch_dtype(dtype)
    # a float32 model passes finfo(float32).min as a mask fill; at the target dtype the model
    # passes that dtype's own (doge's masked_fill): a scalar out of range is clamped, both sides
    args, kwargs = tree_map(lambda v: _in_range(v, target_dtype), (args, kwargs))
    rounded = reference_inputs == "rounded" or kind == "discrete"
    to_ref = (lambda v: _rounded(v, target_dtype)) if rounded else _to_reference
    ref_args, ref_kwargs = tree_map(to_ref, (args, kwargs))
    try:
        with torch.no_grad():
            ref_out = func(*ref_args, **ref_kwargs)
    except Exception as exc:  # the CPU float32 reference itself cannot run it
        return OpRow(**row, status="skipped", reason=f"reference replay raised "
                                                     f"{type(exc).__name__}: {_line(exc)}")
    tgt_args, tgt_kwargs = tree_map(lambda v: _to_target(v, device, target_dtype), (args, kwargs))
    widened = None
    if ran_at and dtype not in ran_at and "float32" in ran_at:
        # the model at the target dtype runs this op in float32 (it upcasts): so does the replay
        widened = f"the model runs it in float32 at {dtype}: replayed so"
        tgt_args, tgt_kwargs = _upcast_inputs(args, kwargs, device, target_dtype)
    try:
        with torch.no_grad():
            tgt_out = func(*tgt_args, **tgt_kwargs)
    except Exception as exc:
        if not _no_kernel_for(exc, target_dtype):
            return OpRow(**row, status="error",
                         reason=f"target raised {type(exc).__name__}: {_line(exc)}")
        # no kernel at the target dtype (triangular_solve in bfloat16): a model that runs it
        # upcasts it (qwen3_next's gated delta rule), or its whole forward on the target
        # raises, which the layer and logit checks report; replayed as the model runs it
        widened = f"no {dtype} kernel: replayed in float32 as the model upcasts it"
        tgt_args, tgt_kwargs = _upcast_inputs(args, kwargs, device, target_dtype)
        try:
            with torch.no_grad():
                tgt_out = func(*tgt_args, **tgt_kwargs)
        except Exception as again:
            return OpRow(**row, status="error",
                         reason=f"target raised {type(again).__name__}: {_line(again)}")
    ref_leaves, ref_spec = tree_flatten(ref_out)
    tgt_leaves, tgt_spec = tree_flatten(tgt_out)
    if ref_spec != tgt_spec:
        return OpRow(**row, status="failed", reason="output structure differs from reference")
    tol = tolerances.for_op(dtype, kind)
    index_ctx = None
    if packet in INDEX_OPS:
        bound = _bind(func, ref_args, ref_kwargs)
        if isinstance(bound.get("self"), torch.Tensor):
            index_ctx = (bound["self"], bound.get("dim", -1 if packet in ("topk", "sort",
                                                                         "argsort") else None))
    elements = mismatched = 0
    max_abs = ratio = 0.0
    problem = None
    for r, t in zip(ref_leaves, tgt_leaves):
        n, bad, err, rat, prob = _compare_leaf(r, t, tol, kind == "discrete", index_ctx)
        elements += n
        mismatched += bad
        max_abs = err if math.isnan(err) or err > max_abs else max_abs
        ratio = max(ratio, rat) if not math.isnan(rat) else math.inf
        problem = problem or prob
    status: Status = "failed" if mismatched else "ok"
    if mismatched and not problem:
        problem = f"{mismatched} of {elements} output elements outside tolerance"
    problem = "; ".join(p for p in (widened, problem) if p) or None
    return OpRow(**row, status=status, elements=elements, mismatched=mismatched,
                 max_abs_error=max_abs, tolerance_ratio=ratio, reason=problem)


def _upcast_inputs(args, kwargs, device: str, dtype: torch.dtype):
    """The target dtype's values, computed in float32: what a model that upcasts the op feeds it."""
    return tree_map(lambda v: _to_target(_rounded(v, dtype), device, torch.float32), (args, kwargs))


def _no_kernel_for(exc: BaseException, dtype: torch.dtype) -> bool:
    """Whether exc is torch's "<kernel> not implemented for '<dtype>'" for this dtype."""
    name = {torch.bfloat16: "BFloat16", torch.float16: "Half"}.get(dtype)
    return bool(name) and isinstance(exc, (NotImplementedError, RuntimeError)) \
        and f"not implemented for '{name}'" in str(exc)


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def replay_recorded(recorder, *, device: str, dtype: str, tolerances: Tolerances,
                    reference_inputs: str = "rounded",
                    run_dtypes: dict[str, set[str]] | None = None) -> list[OpRow]:
    """One row per op an OpRecorder (record_examples=True) saw, sorted by op name.
    run_dtypes: the dtypes each op ran at in a forward of the model at the target dtype
    (:func:`dtypes_at`); an op the model runs only in float32 there (an upcast: softmax
    statistics, histc of expert counts) is replayed in float32, as the model runs it."""
    ops = sorted(recorder.ops.items())
    rows = []
    for i, (name, stats) in enumerate(ops):
        progress.update("ops", i, len(ops), detail=f"replaying {name}")
        rows.append(replay_op(name, stats, recorder.examples.get(name), device=device,
                              dtype=dtype, tolerances=tolerances, reference_inputs=reference_inputs,
                              ran_at=(run_dtypes or {}).get(name)))
    progress.update("ops", len(ops), len(ops), detail="replayed")
    return rows


def dtypes_at(model, input_ids: torch.Tensor) -> dict[str, set[str]] | None:
    """Op name -> the dtypes its tensors had in one forward of model (no examples kept); None
    when the forward raises (a target's fault is the layer and logit checks' to report)."""
    from day0.torchkit.opcapture import OpRecorder

    try:
        with torch.no_grad(), OpRecorder(record_examples=False, track_modules=False) as rec:
            model(input_ids)
    except Exception:  # noqa: BLE001 - then ops are replayed at the target dtype, as before
        return None
    return {name: set(stats.dtypes) for name, stats in rec.ops.items()}


def record_ops(model, input_ids: torch.Tensor, *, max_example_bytes: int = 256 << 20):
    """The OpRecorder of one forward of the reference model on input_ids (first call's inputs
    of each op kept)."""
    from day0.torchkit.opcapture import OpRecorder

    with torch.no_grad(), OpRecorder(record_examples=True,
                                     max_example_bytes=max_example_bytes) as recorder:
        model(input_ids=input_ids, use_cache=False)
    return recorder


def check_ops(model, input_ids: torch.Tensor, *, device: str, dtype: str,
              tolerances: Tolerances, reference_inputs: str = "rounded",
              max_example_bytes: int = 256 << 20) -> list[OpRow]:
    """Record the reference model's ops on input_ids, replay each on the target."""
    recorder = record_ops(model, input_ids, max_example_bytes=max_example_bytes)
    return replay_recorded(recorder, device=device, dtype=dtype, tolerances=tolerances,
                           reference_inputs=reference_inputs)
