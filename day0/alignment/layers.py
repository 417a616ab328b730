"""Per-layer capture and comparison: decoder-layer outputs and MoE expert selections.

Forward hooks copy every decoder layer's output hidden states (and every router's selected
experts) to CPU during one forward. Errors accumulate over all windows as sums of squares per
(layer, position bucket), so the relative error of a bucket is exact over the whole evaluation.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from day0.alignment.base import Row

from day0.modeling import decoder_layers


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    hidden = getattr(output, "last_hidden_state", None)
    return hidden if isinstance(hidden, torch.Tensor) else None


def find_routers(model) -> dict[str, torch.nn.Module]:
    """MoE router modules: class names ending in Router/Gate (Qwen3MoeTopKRouter,
    DeepseekV3TopkRouter, MixtralTopKRouter...) or Linear modules named `gate`/`router` inside a
    block that has experts (older Mixtral-style). Dense models have none."""
    found = {}
    for name, module in model.named_modules():
        cls = type(module).__name__.lower()
        leaf = name.rsplit(".", 1)[-1]
        if cls.endswith("router") or cls.endswith("gate"):
            found[name] = module
        elif isinstance(module, torch.nn.Linear) and leaf in ("gate", "router"):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            if hasattr(parent, "experts"):
                found[name] = module
    return found


def _top_k(model) -> int | None:
    config = getattr(model, "config", None)
    for key in ("num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _selected_experts(output, top_k: int | None) -> torch.Tensor | None:
    """[tokens, k] selected expert indices from a router's output, or None."""
    items = output if isinstance(output, (tuple, list)) else (output,)
    for item in items:
        if isinstance(item, torch.Tensor) and not item.is_floating_point() \
                and item.dtype != torch.bool and item.dim() >= 2:
            return item.reshape(-1, item.shape[-1])
    logits = items[0] if items and isinstance(items[0], torch.Tensor) else None
    if logits is not None and logits.is_floating_point() and top_k:
        return torch.topk(logits.reshape(-1, logits.shape[-1]).float(), top_k, dim=-1).indices
    return None


class Capture:
    """Context manager: hooks that record layer outputs and router choices of one forward."""

    def __init__(self, model, *, routers: bool = True):
        self.layers = decoder_layers(model)
        self.routers = find_routers(model) if routers else {}
        self.top_k = _top_k(model)
        self.hidden: list[torch.Tensor | None] = [None] * len(self.layers)
        self.routes: dict[str, torch.Tensor] = {}
        self._handles = []

    def _layer_hook(self, index):
        def hook(module, args, output):
            tensor = _first_tensor(output)
            if tensor is not None:
                self.hidden[index] = tensor.detach().to("cpu", torch.float32)
        return hook

    def _router_hook(self, name):
        def hook(module, args, output):
            chosen = _selected_experts(output, self.top_k)
            if chosen is not None:
                self.routes[name] = chosen.detach().to("cpu", torch.int64)
        return hook

    def __enter__(self):
        self.hidden = [None] * len(self.layers)
        self.routes = {}
        for i, layer in enumerate(self.layers):
            self._handles.append(layer.register_forward_hook(self._layer_hook(i)))
        for name, module in self.routers.items():
            self._handles.append(module.register_forward_hook(self._router_hook(name)))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        return False


class LayerRow(Row):
    layer: int = Field(description="Decoder layer index.")
    rel_error: float = Field(description="||t-r||/||r|| over all positions and windows.")
    max_abs_error: float = Field(description="Largest element-wise |t-r|.")
    worst_bucket: int = Field(description="Position bucket with the largest relative error.")
    worst_bucket_rel_error: float = Field(description="Relative error in that bucket.")
    bucket_rel_errors: list[float] = Field(description="Relative error per position bucket.")
    nonfinite: int = Field(description="Non-finite elements in the target's output.")
    diverged: bool = Field(description="Exceeds the layer tolerance or jumps over the previous.")


class LayerAccumulator:
    def __init__(self, n_layers: int, n_buckets: int):
        self.diff2 = torch.zeros(n_layers, n_buckets, dtype=torch.float64)
        self.ref2 = torch.zeros(n_layers, n_buckets, dtype=torch.float64)
        self.max_abs = [0.0] * n_layers
        self.nonfinite = [0] * n_layers
        self.missing: set[int] = set()

    def add(self, ref: list, tgt: list, bucket_of: torch.Tensor) -> None:
        """bucket_of: [seq] bucket index of each position of this window."""
        n_buckets = self.diff2.shape[1]
        for i, (r, t) in enumerate(zip(ref, tgt)):
            if r is None or t is None or r.shape != t.shape:
                self.missing.add(i)
                continue
            diff = (t.double() - r.double())
            # [.., seq, hidden] -> per position sums; NaN in the target stays NaN.
            d2 = diff.pow(2).sum(-1).reshape(-1, r.shape[-2]).sum(0)
            r2 = r.double().pow(2).sum(-1).reshape(-1, r.shape[-2]).sum(0)
            self.diff2[i] += torch.zeros(n_buckets, dtype=torch.float64).index_add(0, bucket_of, d2)
            self.ref2[i] += torch.zeros(n_buckets, dtype=torch.float64).index_add(0, bucket_of, r2)
            m = diff.abs().max().item()
            if math.isnan(m) or m > self.max_abs[i]:  # a NaN, once seen, is kept
                self.max_abs[i] = m
            self.nonfinite[i] += int((~torch.isfinite(t)).sum())

    def rows(self, rel_tol: float, jump_factor: float, jump_floor: float) -> list[LayerRow]:
        rows, previous = [], 0.0
        for i in range(self.diff2.shape[0]):
            overall = _rel(self.diff2[i].sum().item(), self.ref2[i].sum().item())
            buckets = [_rel(d, r) for d, r in zip(self.diff2[i].tolist(), self.ref2[i].tolist())]
            if i in self.missing:
                overall, buckets = math.nan, [math.nan] * len(buckets)
            worst = _worst(buckets)
            err = buckets[worst]
            diverged = (not math.isfinite(err) or err > rel_tol
                        or err > jump_factor * max(previous, jump_floor))
            rows.append(LayerRow(layer=i, rel_error=overall, max_abs_error=self.max_abs[i],
                                 worst_bucket=worst, worst_bucket_rel_error=err,
                                 bucket_rel_errors=buckets, nonfinite=self.nonfinite[i],
                                 diverged=diverged))
            previous = err if math.isfinite(err) else previous
        return rows


def _rel(diff2: float, ref2: float) -> float:
    if math.isnan(diff2):
        return math.nan
    if ref2 == 0.0:
        return 0.0 if diff2 == 0.0 else math.inf
    return math.sqrt(diff2 / ref2)


def _worst(values: list[float]) -> int:
    """Index of the largest value; a NaN counts as the largest (it is the worst finding)."""
    for i, v in enumerate(values):
        if math.isnan(v):
            return i
    return max(range(len(values)), key=lambda i: values[i]) if values else 0


class RouterRow(Row):
    router: str = Field(description="Qualified module name of the router.")
    tokens: int = Field(description="Token routings compared.")
    jaccard: float = Field(description="Mean Jaccard index of the selected expert sets.")
    exact: float = Field(description="Fraction of tokens with the identical expert set.")


class RouterAccumulator:
    def __init__(self):
        self.stats: dict[str, list[float]] = {}  # name -> [tokens, jaccard_sum, exact_sum]

    def add(self, ref: dict[str, torch.Tensor], tgt: dict[str, torch.Tensor]) -> None:
        for name, r in ref.items():
            t = tgt.get(name)
            entry = self.stats.setdefault(name, [0, 0.0, 0.0])
            if t is None or t.shape != r.shape:
                # The target's router did not report the same routing: count total disagreement.
                entry[0] += r.shape[0]
                continue
            hits = (r.unsqueeze(-1) == t.unsqueeze(-2)).any(-1)      # [tokens, k]
            inter = hits.sum(-1).double()
            union = r.shape[-1] + t.shape[-1] - inter
            entry[0] += r.shape[0]
            entry[1] += (inter / union).sum().item()
            entry[2] += (inter == r.shape[-1]).double().sum().item()

    def rows(self) -> list[RouterRow]:
        return [RouterRow(router=name, tokens=int(n), jaccard=j / n if n else math.nan,
                          exact=e / n if n else math.nan)
                for name, (n, j, e) in self.stats.items()]
