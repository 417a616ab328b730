"""Record the aten operators a forward pass dispatches (shared by the scan and alignment stages).

Usage::

    from day0.torchkit.opcapture import OpRecorder

    with torch.no_grad(), OpRecorder(record_examples=True, max_example_bytes=64 << 20) as rec:
        model(input_ids)
    rec.ops["aten.mm.default"].count          # calls
    rec.ops["aten.mm.default"].dtypes         # {"bfloat16"} (input and output tensors)
    rec.ops["aten.mm.default"].module         # "LlamaAttention" (first model module seen in)
    args, kwargs = rec.examples["aten.mm.default"]   # first call's inputs, detached CPU clones
    torch.ops.aten.mm.default(*args, **kwargs)       # replay (move tensors to a device first)

Keys are overload names (``str(func)``, e.g. ``aten.mm.default``); ``OpStats.packet`` is the
overload packet (``aten.mm``). Examples are taken BEFORE the call (so in-place ops replay from
their true inputs); tensors are cloned to CPU, meta tensors stay meta (they have no data);
non-tensor arguments (ints, dtypes, devices, lists) are kept as recorded, so a replay on another
device must move tensors and rewrite ``device=`` kwargs itself. An op whose tensors would exceed
the remaining ``max_example_bytes`` is not kept and is listed in ``examples_skipped``.

Subclasses change how an op is executed by overriding :meth:`OpRecorder.call`; the op is
recorded before ``call`` runs, so an op that raises is still counted.

Composite ops whose aten decomposition depends on the device are also recorded under their own
aten name (``composites=True``, see :data:`COMPOSITES`): ``F.scaled_dot_product_attention``
becomes ``aten.scaled_dot_product_attention.default`` (replayable with ``torch.ops.aten...``),
then the kernels it dispatches to on this device (``aten._scaled_dot_product_flash_attention_for_cpu``,
or the math path's bmm/softmax on meta) are recorded as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

# Python-level functions recorded under an aten name: composite ops whose decomposition differs
# per device (SDPA picks a fused kernel per backend; one_hot has a separate meta/fake path).
COMPOSITES = {
    torch.nn.functional.scaled_dot_product_attention:
        ("aten.scaled_dot_product_attention.default", "aten.scaled_dot_product_attention"),
    torch.nn.functional.one_hot: ("aten.one_hot.default", "aten.one_hot"),
}


@dataclass
class OpStats:
    """What was seen of one aten overload."""

    name: str                     # "aten.mm.default"
    packet: str                   # "aten.mm"
    count: int = 0
    dtypes: set[str] = field(default_factory=set)
    module: str | None = None     # class of the innermost model module at the first call


def op_names(func) -> tuple[str, str]:
    """(overload name, overload packet name) of an OpOverload, e.g. ('aten.mm.default', 'aten.mm')."""
    return str(func), str(getattr(func, "overloadpacket", func))


def _tensor_bytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(value)
               if isinstance(t, torch.Tensor) and t.device.type != "meta")


def _clone_to_cpu(value):
    if not isinstance(value, torch.Tensor):
        return value
    if value.device.type == "meta":
        return value.detach()
    return value.detach().to("cpu", copy=True)


class OpRecorder(TorchDispatchMode):
    """TorchDispatchMode counting aten ops, their dtypes and (optionally) one example call each.

    Args:
        record_examples: keep, per distinct op, the first call's ``(args, kwargs)`` in
            :attr:`examples` (tensors detached and cloned to CPU).
        max_example_bytes: total tensor bytes :attr:`examples` may hold.
        track_modules: note the innermost model module class (torch.nn built-ins such as
            Linear are skipped in favour of their parent) each op was first seen in.
        composites: also record the functions in :data:`COMPOSITES` under their aten name.
    """

    def __init__(self, *, record_examples: bool = False, max_example_bytes: int = 256 << 20,
                 track_modules: bool = True, composites: bool = True):
        super().__init__()
        self.record_examples = record_examples
        self.max_example_bytes = max_example_bytes
        self.track_modules = track_modules
        self.composites = composites
        self._function_mode: _CompositeMode | None = None
        self.ops: dict[str, OpStats] = {}
        self.examples: dict[str, tuple[tuple, dict]] = {}
        self.examples_skipped: list[str] = []
        self.example_bytes = 0
        self.last_op: str | None = None
        self._modules: list[str | None] = []
        self._hooks: list[Any] = []

    # -- module tracking: global hooks, only while the mode is active -------------------------
    def __enter__(self):
        if self.track_modules:
            from torch.nn.modules.module import (register_module_forward_hook,
                                                 register_module_forward_pre_hook)

            self._modules = []
            self._hooks = [register_module_forward_pre_hook(self._enter_module),
                           register_module_forward_hook(self._leave_module)]
        if self.composites:
            self._function_mode = _CompositeMode(self)
            self._function_mode.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        result = super().__exit__(*exc)
        if self._function_mode is not None:
            self._function_mode.__exit__(*exc)
            self._function_mode = None
        return result

    def _enter_module(self, module, _inputs):
        builtin = type(module).__module__.startswith("torch.nn")
        parent = self._modules[-1] if self._modules else None
        self._modules.append(parent if builtin else type(module).__name__)

    def _leave_module(self, _module, _inputs, _output):
        if self._modules:
            self._modules.pop()

    # -- dispatch ----------------------------------------------------------------------------
    def call(self, func, args: tuple, kwargs: dict):
        """Execute one op; override to change how ops run (fallbacks, synthetic values)."""
        return func(*args, **kwargs)

    def call_composite(self, func, args: tuple, kwargs: dict):
        """Execute one COMPOSITES function (its aten kernels are dispatched and recorded)."""
        return func(*args, **kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        stats = self._record(*op_names(func), args, kwargs)
        out = self.call(func, args, kwargs)
        _add_dtypes(stats, out)
        return out

    def _record(self, name: str, packet: str, args, kwargs) -> OpStats:
        self.last_op = name
        stats = self.ops.get(name)
        if stats is None:
            stats = self.ops[name] = OpStats(
                name, packet, module=self._modules[-1] if self._modules else None)
            if self.record_examples:
                self._keep_example(name, args, kwargs)
        stats.count += 1
        _add_dtypes(stats, (args, kwargs))
        return stats

    def _keep_example(self, name: str, args, kwargs) -> None:
        size = _tensor_bytes((args, kwargs))
        if self.example_bytes + size > self.max_example_bytes:
            self.examples_skipped.append(name)
            return
        self.example_bytes += size
        self.examples[name] = (tuple(tree_map(_clone_to_cpu, list(args))),
                               tree_map(_clone_to_cpu, dict(kwargs)))

    def rows(self) -> list[dict]:
        """One plain dict per op, sorted by name: name, packet, count, dtypes (sorted), module."""
        return [{"name": s.name, "packet": s.packet, "count": s.count,
                 "dtypes": sorted(s.dtypes), "module": s.module}
                for s in sorted(self.ops.values(), key=lambda s: s.name)]


def _add_dtypes(stats: OpStats, value) -> None:
    stats.dtypes.update(str(t.dtype).removeprefix("torch.") for t in tree_leaves(value)
                        if isinstance(t, torch.Tensor))


class _CompositeMode(TorchFunctionMode):
    """Routes COMPOSITES calls to the recorder; everything else passes through untouched."""

    def __init__(self, recorder: OpRecorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        names = COMPOSITES.get(func)
        if names is None:
            return func(*args, **kwargs)
        stats = self.recorder._record(*names, args, kwargs)
        out = self.recorder.call_composite(func, args, kwargs)
        _add_dtypes(stats, out)
        return out


__all__ = ["OpRecorder", "OpStats", "op_names", "COMPOSITES"]
