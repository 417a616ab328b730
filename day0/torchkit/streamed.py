"""Run a causal LM layer by layer, each layer's weights read from the shards only while it runs.

A model is built as a skeleton: transformers' own class, parameters on the meta device, buffers
(rotary frequencies, embedding scales) real. The caller drives it layer-major: ``prepare`` turns
token ids into the first layer's input and records what the model's own forward passes every
decoder layer (masks, rotary embeddings, position ids); ``run_layer(k)`` reads layer k, runs it
on every prepared batch, frees it; ``logits`` applies the final norm and the head, reading the
head in row blocks. Peak memory is one layer plus activations, not the model.

MoE experts are read on demand: the router runs, then only the experts some token was routed
to are read and handed to the experts module's own forward (``expert_group_bytes`` at a time),
so the numbers equal the resident model's (the test compares them).

Same modules, dtypes and op order as the resident path: a window computed in one forward gives
bit-identical hidden states and logits. Limits: a window is one forward (no KV-cache chunks), and
plugins that rewrite weights when applied cannot see streamed weights.
"""

from __future__ import annotations

import contextlib
import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from day0.errors import InputError
from day0.checkpoint.modeling import (build_error, check_source, decoder_layers, quiet_transformers,
                                      resolve_config)
from day0.checkpoint.files import read_config
from day0.torchkit.dtypes import torch_dtype
from day0.torchkit.weights import WeightStore

# per-expert checkpoint names of a fused [experts, 2 x inter, hidden] gate_up_proj / down_proj
# (transformers' qwen2_moe- and mixtral-style conversions)
EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


class _Stop(Exception):
    """Raised by the last recording layer: the skeleton's forward has given all it must."""


@dataclass
class Batch:
    """One batch of token ids on its way through the layers."""

    hidden: torch.Tensor | None
    args: list[tuple] = field(default_factory=list)     # per layer: positional args after hidden
    kwargs: list[dict] = field(default_factory=list)    # per layer: keyword args


class _LargeOnMeta(torch.overrides.TorchFunctionMode):
    """Tensor factories asked for more than ``LARGE`` elements without a device allocate on
    meta: a fused experts parameter (DeepSeek-V3: 256 x 4096 x 7168) is never allocated, while
    small tensors (rotary frequencies, norm weights) are built for real."""

    LARGE = 1 << 20
    FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.randn, torch.rand}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self.FACTORIES and kwargs.get("device") is None:
            size = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else \
                [a for a in args if isinstance(a, int)] if func is not torch.full else args[0]
            numel = 1
            for dim in size:
                numel *= int(dim)
            if numel > self.LARGE:
                kwargs["device"] = "meta"
        return func(*args, **kwargs)


@contextlib.contextmanager
def _params_on_meta():
    """Parameters created in this block live on the meta device; buffers stay real."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None:
            module._parameters[name] = torch.nn.Parameter(
                module._parameters[name].to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = on_meta
    try:
        with _LargeOnMeta():
            yield
    finally:
        torch.nn.Module.register_parameter = register


def _set_param(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    target = module.get_submodule(owner) if owner else module
    target._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)


def _unrecorded():
    """Weight reads are not the model's ops: hide them from an active op recorder."""
    from torch.utils._python_dispatch import _disable_current_modes

    stack = contextlib.ExitStack()
    stack.enter_context(_disable_current_modes())
    stack.enter_context(torch._C.DisableTorchFunction())
    return stack


class StreamedModel:
    """A checkpoint's causal LM whose weights are read per layer (see the module docstring)."""

    def __init__(self, source: str | Path, *, dtype: str = "float32", device: str = "cpu",
                 trust_remote_code: bool = False, expert_group_bytes: int = 1 << 30,
                 head_block_bytes: int = 512 << 20, weights: WeightStore | None = None):
        check_source(str(source))
        raw, file = read_config(source)  # local or s3://
        resolved = resolve_config(copy.deepcopy(raw), trust_remote_code=trust_remote_code,
                                  file=file)
        self.dtype, self.device = torch_dtype(dtype), device
        try:
            with quiet_transformers(), _params_on_meta():
                model = resolved.model_class._from_config(resolved.class_config, dtype=self.dtype)
        except (ImportError, MemoryError):
            raise
        except Exception as exc:
            raise build_error(exc, resolved) from None
        self.model = model.eval()
        self.config = model.config
        unbuilt = [n for n, b in model.named_buffers() if b is not None and b.is_meta]
        if unbuilt:
            raise InputError(f"streaming cannot build the buffer '{unbuilt[0]}' without "
                             "allocating the model", field="streaming",
                             fix="validate this model with streaming: off (resident)")
        self.store = weights or WeightStore(source)
        self.sources = _checkpoint_names(model, self.store)  # model name -> checkpoint name
        self.expert_group_bytes, self.head_block_bytes = expert_group_bytes, head_block_bytes
        self.base = getattr(model, "model", model)
        self.layers = decoder_layers(model)
        names = {id(m): n for n, m in model.named_modules()}
        self.layer_names = [names[id(layer)] for layer in self.layers]
        self.embed = model.get_input_embeddings()
        self.embed_name = names[id(self.embed)] + ".weight"
        self.head = model.get_output_embeddings()
        head_name = names[id(self.head)] + ".weight"
        self.head_name = head_name if head_name in self.sources else self.embed_name  # tied
        self.experts = {names[id(m)]: m for m in model.modules() if _is_experts(m)}
        for prefix, module in self.experts.items():
            module.forward = self._experts_forward(prefix, module)
        for module in model.modules():  # buffers (rotary, scales) to the device; params stay
            for key, buf in list(module._buffers.items()):
                if buf is not None:
                    module._buffers[key] = buf.to(device)
        self._check_covered(names)
        self._load(self._others(), "")
        self.experts_read = 0
        self.progress: Callable[[str], None] | None = None  # told of each expert group read

    # ------------------------------------------------------------------ weights
    def _others(self) -> torch.nn.Module:
        """The modules outside the decoder layers and the embedding/head (final norm...)."""
        return self.base.get_submodule("norm") if hasattr(self.base, "norm") else torch.nn.Module()

    def _check_covered(self, names: dict) -> None:
        """Every parameter must belong to a layer, the embedding, the head or the final norm;
        a model with other parts (vision towers, MTP) is not streamed silently wrong."""
        known = tuple(f"{n}." for n in self.layer_names) + (self.embed_name, self.head_name,
                                                           names[id(self.head)] + ".")
        norm = names.get(id(self._others()))
        for name, _ in self.model.named_parameters(remove_duplicate=False):
            if not name.startswith(known) and not (norm and name.startswith(norm + ".")):
                raise InputError(f"streaming does not know where '{name}' runs", field="streaming",
                                 fix="validate this model with streaming: off (resident)")

    def _load(self, module: torch.nn.Module, prefix: str) -> None:
        """Read every parameter (and stored buffer) of module from the shards; experts are
        left to on-demand reads."""
        if not prefix:
            prefix = self._prefix(module)
        skip = tuple(f"{n}." for n in self.experts)
        with _unrecorded():
            for name, param in list(module.named_parameters()):
                full = f"{prefix}{name}"
                if full.startswith(skip):
                    continue
                tensor = self.store.read(self.sources.get(full, full), param.dtype)
                tensor = tensor.to(self.device)
                _set_param(module, name, tensor)
            for name, buf in list(module.named_buffers()):
                full = f"{prefix}{name}"
                if full in self.sources and buf is not None:
                    owner, _, leaf = name.rpartition(".")
                    target = module.get_submodule(owner) if owner else module
                    target._buffers[leaf] = self.store.read(self.sources[full], buf.dtype).to(
                        self.device)

    def _prefix(self, module: torch.nn.Module) -> str:
        for name, m in self.model.named_modules():
            if m is module:
                return f"{name}." if name else ""
        return ""

    @staticmethod
    def _free(module: torch.nn.Module) -> None:
        with _unrecorded():
            for name, param in list(module.named_parameters()):
                if param.device.type != "meta":
                    _set_param(module, name, torch.empty_like(param, device="meta"))

    @contextlib.contextmanager
    def layer(self, k: int):
        """Layer k's weights while in the block."""
        self._load(self.layers[k], f"{self.layer_names[k]}.")
        try:
            yield
        finally:
            self._free(self.layers[k])

    # ------------------------------------------------------------------ forward
    def prepare(self, input_ids: torch.Tensor, *, positions: bool = True) -> Batch:
        """[batch, positions] ids -> the first layer's input and every layer's arguments, as
        the skeleton's own forward builds them (embedding rows read for the ids present).
        positions: pass explicit position ids (as the resident windows do), else the model
        derives them (as a plain ``model(input_ids)`` call does)."""
        ids = input_ids.to("cpu")
        with _unrecorded():
            present, local = torch.unique(ids, return_inverse=True)
            rows = self.store.gather_rows(self.sources.get(self.embed_name, self.embed_name),
                                          present.tolist(),
                                          self.embed.weight.dtype).to(self.device)
        batch = Batch(hidden=None)
        handles, forwards = [], []
        last = len(self.layers) - 1

        def record(k):
            def hook(module, args, kwargs):
                if k == 0:
                    batch.hidden = args[0] if args else kwargs.pop("hidden_states")
                batch.args.append(tuple(args[1:]))
                batch.kwargs.append({key: v for key, v in kwargs.items()
                                     if key != "hidden_states"})
                if k == last:
                    raise _Stop
            return hook

        saved = (self.embed.weight, getattr(self.embed, "padding_idx", None))
        try:
            # a table of the present rows only; padding_idx only matters for gradients
            self.embed._parameters["weight"] = torch.nn.Parameter(rows, requires_grad=False)
            if saved[1] is not None:
                self.embed.padding_idx = None
            for k, layer in enumerate(self.layers):
                handles.append(layer.register_forward_pre_hook(record(k), with_kwargs=True))
                forwards.append(layer.forward)
                layer.forward = lambda hidden_states, *a, **kw: hidden_states
            with _unrecorded():
                local = local.to(self.device)
                where = ({"position_ids": torch.arange(ids.shape[1], device=self.device)[None]}
                         if positions else {})
            with torch.no_grad(), contextlib.suppress(_Stop):
                self.base(input_ids=local, use_cache=False, **where)
        finally:
            for handle in handles:
                handle.remove()
            for layer in self.layers:
                layer.__dict__.pop("forward", None)
            self.embed._parameters["weight"] = saved[0]
            if saved[1] is not None:
                self.embed.padding_idx = saved[1]
        if len(batch.kwargs) != len(self.layers):
            raise InputError(f"{type(self.model).__name__} did not call its decoder layers in "
                             "order", field="streaming",
                             fix="validate this model with streaming: off (resident)")
        return batch

    def run_layer(self, k: int, batch: Batch) -> None:
        with torch.no_grad():
            out = self.layers[k](batch.hidden, *batch.args[k], **batch.kwargs[k])
        batch.hidden = out[0] if isinstance(out, (tuple, list)) else out
        batch.args[k], batch.kwargs[k] = (), {}  # this layer's masks are no longer needed

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[batch, positions, vocab] from the last layer's output, by the model's own forward
        after its layers (final norm, head, and whatever the class does to logits: softcapping,
        logit scales), the head read in row blocks (all of that is per logit)."""
        source = self.sources.get(self.head_name, self.head_name)
        rows, width = self.store.shape(source)
        block = max(1, self.head_block_bytes // (width * self.head.weight.element_size()))
        bias = self.head._parameters.get("bias")
        parts = []
        with torch.no_grad():
            for a in range(0, rows, block):
                b = min(rows, a + block)
                with _unrecorded():
                    weight = self.store.read(source, self.head.weight.dtype, rows=(a, b))
                    part_bias = (self.store.read(self.sources[self.head_name[:-6] + "bias"],
                                                 bias.dtype, rows=(a, b)) if bias is not None
                                 else None)
                parts.append(self._tail(hidden, weight.to(self.device), part_bias))
                del weight
            with _unrecorded():
                return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _tail(self, hidden: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
        """The model's forward with every layer passing through and the last one answering
        ``hidden``: what follows the layers runs as the class wrote it."""
        saved = dict(self.head._parameters)
        self.head._parameters["weight"] = torch.nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            self.head._parameters["bias"] = torch.nn.Parameter(bias.to(self.device),
                                                               requires_grad=False)
        last = len(self.layers) - 1
        try:
            for k, layer in enumerate(self.layers):
                layer.forward = ((lambda *a, **kw: hidden) if k == last
                                 else (lambda hidden_states, *a, **kw: hidden_states))
            with _unrecorded():
                placeholder = torch.zeros_like(hidden)  # the embedding's output, never used
                positions = torch.arange(hidden.shape[1], device=self.device)[None]
            return self.model(inputs_embeds=placeholder, position_ids=positions,
                              use_cache=False).logits
        finally:
            for layer in self.layers:
                layer.__dict__.pop("forward", None)
            self.head._parameters.update(saved)

    def __call__(self, input_ids: torch.Tensor, **_ignored) -> "_Output":
        """A whole forward (every layer read once): for the op replay and greedy decoding."""
        batch = self.prepare(input_ids, positions=False)
        for k in range(len(self.layers)):
            with self.layer(k):
                self.run_layer(k, batch)
        return _Output(self.logits(batch.hidden))

    # ------------------------------------------------------------------ experts
    def _experts_forward(self, prefix: str, module) -> Callable:
        """The experts module's own forward (whichever implementation transformers picked),
        given only the experts some token was routed to, read when needed. When they exceed
        ``expert_group_bytes`` they run in groups like expert-parallel ranks (the others are
        sentinels) and the group outputs are summed, as an EP all-reduce does."""
        gate_up_name, down_name = f"{prefix}.gate_up_proj", f"{prefix}.down_proj"
        fused = gate_up_name in self.store
        # per-expert tensors: under the checkpoint's own prefix (Mixtral: block_sparse_moe)
        member = re.match(r"^(.*)\.\d+\.[^.]+\.weight$", self.sources.get(gate_up_name, ""))
        source_prefix = member.group(1) if member else prefix
        names = next((n for n in EXPERT_NAMES if f"{source_prefix}.0.{n[0]}.weight" in self.store),
                     EXPERT_NAMES[0])
        meta_gate_up, meta_down = module.gate_up_proj, module.down_proj
        dtype, experts = meta_gate_up.dtype, module.num_experts
        per_expert = (meta_gate_up[0].numel() + meta_down[0].numel()) \
            * torch.empty((), dtype=dtype).element_size()
        own_forward = type(module).forward

        def read(j: int) -> tuple[torch.Tensor, torch.Tensor]:
            if fused:
                return (self.store.read(gate_up_name, dtype, index=j),
                        self.store.read(down_name, dtype, index=j))
            gate, up, down = (self.store.read(f"{source_prefix}.{j}.{n}.weight", dtype)
                              for n in names)
            gate_up = torch.cat([gate, up], dim=0)
            if getattr(module, "is_transposed", False):  # [hidden, 2 x inter] layout
                gate_up, down = gate_up.T, down.T
            return gate_up, down

        def forward(hidden_states, top_k_index, top_k_weights):
            with _unrecorded():  # bookkeeping and reads are day0's, not the model's ops
                hit = [int(e) for e in torch.unique(top_k_index) if 0 <= int(e) < experts]
            size = max(1, self.expert_group_bytes // max(per_expert, 1))
            groups = [hit[g:g + size] for g in range(0, len(hit), size)] or [[]]
            total = None
            try:
                module._is_expert_parallel = len(groups) > 1
                for g, group in enumerate(groups):
                    with _unrecorded():
                        index = _local_index(group, experts, top_k_index)
                        gate_up, down = _stacked(group, read, meta_gate_up, meta_down,
                                                 self.device)
                    self.experts_read += len(group)
                    module._parameters["gate_up_proj"] = gate_up
                    module._parameters["down_proj"] = down
                    module.num_experts = len(group)
                    out = own_forward(module, hidden_states, index, top_k_weights)
                    total = out if total is None else total + out
                    if self.progress and len(groups) > 1:
                        self.progress(f"{prefix}: {min(len(hit), (g + 1) * size)} of {len(hit)} "
                                      "routed experts read")
            finally:
                module.num_experts, module._is_expert_parallel = experts, False
                module._parameters["gate_up_proj"] = meta_gate_up
                module._parameters["down_proj"] = meta_down
            return total

        return forward


def _local_index(group: list[int], experts: int, top_k_index: torch.Tensor) -> torch.Tensor:
    """Expert ids renumbered within the group; experts outside it become the sentinel."""
    local = torch.full((experts + 1,), len(group), dtype=top_k_index.dtype)
    local[group] = torch.arange(len(group), dtype=top_k_index.dtype)
    return local.to(top_k_index.device)[top_k_index]


def _stacked(group: list[int], read, meta_gate_up, meta_down, device) -> tuple:
    """[group, ...] gate_up and down parameters, each expert read straight into its slot (one
    expert's read buffer at a time on top of the group)."""
    gate_up = torch.empty((len(group), *meta_gate_up.shape[1:]), dtype=meta_gate_up.dtype,
                          device=device)
    down = torch.empty((len(group), *meta_down.shape[1:]), dtype=meta_down.dtype, device=device)
    for i, j in enumerate(group):
        gate_up[i], down[i] = read(j)
    return (torch.nn.Parameter(gate_up, requires_grad=False),
            torch.nn.Parameter(down, requires_grad=False))


@dataclass
class _Output:
    logits: torch.Tensor


def _checkpoint_names(model, store: WeightStore) -> dict[str, str]:
    """Model parameter/buffer name -> the checkpoint tensor it loads from, by transformers' own
    loading conversions (renamed modules; for merged experts, one of the per-expert tensors)."""
    from day0.checkpoint.match import renamer, split_targets

    _, rename, _, splits = renamer(model)
    found: dict[str, str] = {}
    for name in sorted(store.tensors):
        target, pattern = rename(name)
        if len(split_targets(target, pattern, splits)) > 1:
            # one fused tensor split into several parameters on load: streaming reads a
            # parameter from one tensor whole
            raise InputError(f"streaming cannot split '{name}' into the parameters it fills",
                             field="streaming", fix="validate this model with streaming: off "
                                                    "(resident)")
        found.setdefault(target, name)
    return found


def _is_experts(module) -> bool:
    params = module._parameters
    return (isinstance(getattr(module, "num_experts", None), int) and "gate_up_proj" in params
            and "down_proj" in params and params["gate_up_proj"] is not None
            and params["gate_up_proj"].dim() == 3 and set(params) == {"gate_up_proj", "down_proj"})


def greedy(model: StreamedModel, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuations of equal-length prompts: one streamed forward per new token (no
    KV cache: every token costs a read of the weights)."""
    ids = torch.tensor(prompts)
    for _ in range(new_tokens):
        nxt = model(ids).logits[:, -1].float().argmax(-1, keepdim=True).cpu()
        ids = torch.cat([ids, nxt], dim=1)
    return ids[:, len(prompts[0]):].tolist()


__all__ = ["StreamedModel", "Batch", "greedy", "WeightStore"]
