"""Per-layer capture and comparison: decoder-layer outputs and MoE expert selections.

Forward hooks copy every decoder layer's output hidden states (and every router's selected
experts) to CPU during one forward (one chunk of a window). The relative errors of the target
and of the control against the reference are kept per scored position and layer, so the
target/control ratio can be bootstrapped per layer and position bucket.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from day0.execution.contract import Row
from day0.torchkit.paired import Blocks, ratios

from day0.checkpoint.modeling import decoder_layers


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
        if cls.endswith(("router", "gate", "gating")):  # JetMoeTopKGating
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
    # router logits: the first output, else the first float matrix wider than k (JetMoE's
    # gating returns sorted indices first and its logits last)
    floats = [x for x in items if isinstance(x, torch.Tensor) and x.is_floating_point()
              and x.dim() >= 2 and top_k and x.shape[-1] > top_k]
    logits = items[0] if items and any(items[0] is x for x in floats) else next(iter(floats), None)
    if logits is not None:
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


def _as_positions(x, n: int):
    """A layer output as [..., n, features]: as it is when its second-last axis holds the n
    positions; with the axes after the positions flattened when an earlier one does
    (DeepSeek-V4's hyper-connection streams, [1, n, 4, hidden]); None when none does."""
    if x is None or x.dim() < 2:
        return None
    if x.shape[-2] == n:
        return x
    for axis in range(x.dim() - 3, -1, -1):
        if x.shape[axis] == n:
            return x.flatten(axis + 1)
    return None


class LayerRow(Row):
    layer: int = Field(description="Decoder layer index.")
    rel_error: float = Field(description="Target: mean over scored positions of ||t-r||/||r||.")
    control_rel_error: float = Field(description="Control: mean of ||c-r||/||r||, same positions.")
    ratio: float = Field(description="Target error / control error (control floored), whole layer.")
    ratio_low: float = Field(description=(
        "Largest over position buckets of the 95 % lower bound of target/control error; the "
        "layer diverges when this exceeds `bound`."))
    bound: float = Field(description="Allowed target/control error ratio (tolerances.yaml).")
    max_abs_error: float = Field(description="Largest element-wise |t-r|.")
    worst_bucket: int = Field(description="Position bucket with the largest ratio lower bound.")
    worst_bucket_rel_error: float = Field(description="Target relative error in that bucket.")
    bucket_rel_errors: list[float] = Field(description="Target relative error per bucket.")
    bucket_control_rel_errors: list[float] = Field(description="Control relative error per bucket.")
    nonfinite: int = Field(description="Non-finite elements in the target's output.")
    diverged: bool = Field(description="Non-finite, or worse than the control beyond the bound.")
    ran: bool = Field(True, description=(
        "False when the layer ran on no side for this input (Mllama's cross-attention layers "
        "skip text without an image): nothing to compare, so never diverged."))


class LayerAccumulator:
    """Per scored position and layer: relative error ||x-r|| / ||r|| of target and control.

    Per-position relative errors are averaged (not squared errors summed): a handful of tokens
    that a correct bf16 port routes to another expert at a near-tie (MoE) carry large errors that
    would dominate a sum of squares and mimic a diverging layer, while a real kernel fault raises
    the error at most positions and moves the mean just as much."""

    def __init__(self, n_layers: int):
        self.n_layers = n_layers
        self.err_t: list[torch.Tensor] = []   # chunks of [n, layers]
        self.err_c: list[torch.Tensor] = []
        self.max_abs = [0.0] * n_layers
        self.nonfinite = [0] * n_layers
        self.missing: set[int] = set()
        self.skipped: set[int] = set()  # no output on any side in some chunk

    @staticmethod
    def _per_position(x: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        # [.., seq, hidden] -> [seq] sums of squares; NaN in the target stays NaN.
        return x.double().pow(2).sum(-1).reshape(-1, x.shape[-2]).sum(0)[scored]

    def add(self, ref: list, ctl: list, tgt: list, scored: torch.Tensor) -> None:
        """One chunk of one window: hidden states per layer; scored: [seq] bool mask."""
        slot = self.open(scored)
        for i, (r, c, t) in enumerate(zip(ref, ctl, tgt)):
            self.fill(slot, i, r, c, t, scored)

    def open(self, scored: torch.Tensor) -> int:
        """A slot for one chunk's scored positions, every layer unknown (NaN) until filled;
        the streamed path fills it one layer at a time."""
        n = int(scored.sum())
        self.err_t.append(torch.full((n, self.n_layers), math.nan, dtype=torch.float64))
        self.err_c.append(self.err_t[-1].clone())
        return len(self.err_t) - 1

    def fill(self, slot: int, i: int, r, c, t, scored: torch.Tensor) -> None:
        """Layer i of the chunk in ``slot``: reference, control and target hidden states. A
        layer whose output has no positions axis of the chunk's length is not compared (the
        logits still are): its index goes to ``missing``."""
        if not scored.numel():  # a chunk with no position (nothing scored in it)
            return
        if r is None and c is None and t is None:  # the model skipped the layer on every side
            self.skipped.add(i)
            return
        r, c, t = (_as_positions(x, scored.numel()) for x in (r, c, t))
        if r is None or t is None or c is None or r.shape != t.shape or r.shape != c.shape:
            self.missing.add(i)
            return
        diff = t.double() - r.double()
        r2 = self._per_position(r, scored).clamp(min=1e-300)
        self.err_t[slot][:, i] = (self._per_position(diff, scored) / r2).sqrt()
        self.err_c[slot][:, i] = (self._per_position(c.double() - r.double(), scored) / r2).sqrt()
        sel = diff.reshape(-1, r.shape[-2], r.shape[-1])[:, scored]
        m = sel.abs().max().item() if sel.numel() else 0.0
        if math.isnan(m) or m > self.max_abs[i]:  # a NaN, once seen, is kept
            self.max_abs[i] = m
        self.nonfinite[i] += int((~torch.isfinite(t)).sum())

    def rows(self, blocks: Blocks, n_buckets: int, floor: float, bound: float) -> list[LayerRow]:
        err_t, err_c = torch.cat(self.err_t), torch.cat(self.err_c)
        overall = ratios([f"layer {i}" for i in range(self.n_layers)], err_t, err_c, blocks,
                         floor)
        per_bucket = [ratios([f"layer {i} bucket {b}" for i in range(self.n_layers)], err_t,
                             err_c, blocks, floor, blocks.bucket_of_block == b)
                      for b in range(n_buckets)]
        rows = []
        for i in range(self.n_layers):
            cells = [per_bucket[b][i] for b in range(n_buckets)]
            lows = [c.low if c.positions else -math.inf for c in cells]
            if i in self.missing:
                lows = [math.nan] * n_buckets
            worst_b = _worst(lows)
            low = lows[worst_b]
            target_err = math.nan if i in self.missing else overall[i].target
            ran = not (i in self.skipped and i not in self.missing
                       and bool(torch.isnan(err_t[:, i]).all()))
            diverged = ran and (not math.isfinite(low) or low > bound
                                or not math.isfinite(target_err) or self.nonfinite[i] > 0)
            rows.append(LayerRow(
                layer=i, rel_error=target_err,
                control_rel_error=math.nan if i in self.missing else overall[i].control,
                ratio=math.nan if i in self.missing else overall[i].ratio,
                ratio_low=low, bound=bound, max_abs_error=self.max_abs[i], worst_bucket=worst_b,
                worst_bucket_rel_error=cells[worst_b].target if i not in self.missing else math.nan,
                bucket_rel_errors=[c.target if c.positions else math.nan for c in cells],
                bucket_control_rel_errors=[c.control if c.positions else math.nan for c in cells],
                nonfinite=self.nonfinite[i], diverged=diverged, ran=ran))
        return rows


def _worst(values: list[float]) -> int:
    """Index of the largest value; a NaN counts as the largest (it is the worst finding)."""
    for i, v in enumerate(values):
        if math.isnan(v):
            return i
    return max(range(len(values)), key=lambda i: values[i]) if values else 0


class RouterRow(Row):
    router: str = Field(description="Qualified module name of the router.")
    tokens: int = Field(description="Scored token routings compared.")
    jaccard: float = Field(description="Target: mean Jaccard index of the selected expert sets.")
    exact: float = Field(description="Target: fraction of tokens with the identical expert set.")
    control_jaccard: float = Field(description="Control: mean Jaccard index, same tokens.")


def _jaccard(r: torch.Tensor, t: torch.Tensor | None) -> torch.Tensor:
    """[tokens] Jaccard index of selected expert sets; a missing routing agrees nowhere."""
    if t is None or t.shape != r.shape:
        return torch.zeros(r.shape[0], dtype=torch.float64)
    inter = (r.unsqueeze(-1) == t.unsqueeze(-2)).any(-1).sum(-1).double()
    return inter / (r.shape[-1] + t.shape[-1] - inter)


class RouterAccumulator:
    """Expert-set agreement with the reference per router, and per scored position (mean over
    routers) for the paired comparison of target and control."""

    def __init__(self):
        self.stats: dict[str, list[float]] = {}  # name -> [tokens, jacc_t, exact_t, jacc_c]
        self.disagree_t: list[torch.Tensor] = []
        self.disagree_c: list[torch.Tensor] = []

    def add(self, ref: dict[str, torch.Tensor], ctl: dict[str, torch.Tensor],
            tgt: dict[str, torch.Tensor], scored: torch.Tensor) -> None:
        per_t, per_c = [], []
        for name, r in ref.items():
            if r.shape[0] != scored.shape[0]:
                continue  # a router that does not see one row per position cannot be paired
            jt, jc = _jaccard(r, tgt.get(name))[scored], _jaccard(r, ctl.get(name))[scored]
            entry = self.stats.setdefault(name, [0, 0.0, 0.0, 0.0])
            entry[0] += int(jt.numel())
            entry[1] += jt.sum().item()
            entry[2] += (jt == 1).double().sum().item()
            entry[3] += jc.sum().item()
            per_t.append(1 - jt)
            per_c.append(1 - jc)
        if per_t:
            self.disagree_t.append(torch.stack(per_t).mean(0))
            self.disagree_c.append(torch.stack(per_c).mean(0))

    def positions(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per scored position: mean expert-set disagreement (1 - Jaccard) of target, control."""
        if not self.disagree_t:
            return None
        return torch.cat(self.disagree_t), torch.cat(self.disagree_c)

    def rows(self) -> list[RouterRow]:
        return [RouterRow(router=name, tokens=int(n), jaccard=j / n if n else math.nan,
                          exact=e / n if n else math.nan, control_jaccard=c / n if n else math.nan)
                for name, (n, j, e, c) in self.stats.items()]
