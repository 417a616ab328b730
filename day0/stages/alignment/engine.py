"""Run the reference, the control and the target over the same windows, chunk by chunk, and
accumulate what each computes against the reference.

* reference - the checkpoint in float32 on the reference device (cpu): the truth;
* control   - the same implementation at the TARGET's dtype on the reference device, no plugins:
              a known-good port, so its error is what a correct port of this model at this dtype
              costs (it differs per model: SmolLM2's last layer carries twice the bf16 error of
              the others with no fault anywhere);
* target    - the target's device, dtype and plugins.

A window longer than ``chunk_tokens`` runs in chunks over a KV cache (explicit position ids), so
memory is bounded by a chunk's activations while positions reach the trained context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch

from day0.stages.alignment.layers import Capture, LayerAccumulator, RouterAccumulator
from day0.stages.alignment.logits import LogitAccumulator, bucket_index
from day0.torchkit.evaltext import Window
from day0.torchkit.kvcache import cache_argument
from day0.execution import progress as stage_progress
from day0.errors import TargetFault


@dataclass
class Step:
    start: int
    logits: torch.Tensor              # [chunk, vocab] float32 on CPU
    hidden: list                      # per decoder layer [.., chunk, hidden] float32 CPU
    routes: dict


def _last(hidden, n: int):
    """A layer output's last n positions (all of them unless the model prepends tokens)."""
    if hidden is None or hidden.dim() < 2 or hidden.shape[-2] <= n:
        return hidden
    return hidden[..., -n:, :]


class Side:
    """One model and where it runs; target failures are findings about the target."""

    def __init__(self, name: str, model, device: str, plugins: list[str] | None = None):
        self.name, self.model, self.device, self.plugins = name, model, device, plugins or []
        self.capture = Capture(model)
        self.n_layers = len(self.capture.layers)

    def steps(self, ids: list[int], chunk: int) -> Iterator[Step]:
        from transformers import DynamicCache

        x = torch.tensor([ids], device=self.device)
        cache = DynamicCache(config=self.model.config) if len(ids) > chunk else None
        # transformers 5.x renamed past_key_values to cache; remote code may still use the old
        cache_kw = {} if cache is None else {cache_argument(self.model): cache}
        for start in range(0, len(ids), chunk):
            end = min(start + chunk, len(ids))
            positions = torch.arange(start, end, device=self.device)[None]
            try:
                with torch.no_grad(), self.capture:
                    out = self.model(input_ids=x[:, start:end], position_ids=positions,
                                     use_cache=cache is not None, **cache_kw)
            except Exception as exc:
                if self.name != "target":
                    raise
                raise TargetFault(f"target forward raised {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}",
                                 field="target.plugins" if self.plugins else "target",
                                 fix="fix the target's kernels/plugins for the failing op"
                                 ) from exc
            n = end - start  # a model may prepend virtual tokens (CPM-Ant's prompt): the last n
            yield Step(start, out.logits[0, -n:].detach().to("cpu", torch.float32),
                       [_last(h, n) for h in self.capture.hidden], dict(self.capture.routes))


class KeptSide(Side):
    """A reference or control whose outputs are kept per window: validating several targets
    against one checkpoint (calibration, tests) computes each reference/control window once."""

    def __init__(self, name: str, model, device: str, plugins: list[str] | None = None):
        super().__init__(name, model, device, plugins)
        self.kept: dict[tuple, list[Step]] = {}

    def steps(self, ids: list[int], chunk: int) -> Iterator[Step]:
        key = (hash(tuple(ids)), len(ids), chunk)
        if key not in self.kept:
            self.kept[key] = list(super().steps(ids, chunk))
        yield from self.kept[key]


@dataclass
class Evidence:
    """Everything accumulated over the windows, per scored position."""

    layers: LayerAccumulator
    logits: LogitAccumulator = field(default_factory=LogitAccumulator)
    routers: RouterAccumulator = field(default_factory=RouterAccumulator)
    window_of: list[torch.Tensor] = field(default_factory=list)
    bucket_of: list[torch.Tensor] = field(default_factory=list)
    position_of: list[torch.Tensor] = field(default_factory=list)

    def column(self, name: str) -> torch.Tensor:
        return torch.cat(getattr(self, name))


def evaluate(wins: list[Window], reference, control, target: Side | None, *,
             span: int, n_buckets: int, chunk: int, progress=print) -> Evidence:
    """target None: the target is the control itself (same device, dtype, no plugins).
    reference and control: a Side, or a bank's (banked.BankSide, banked.Recorder)."""
    evidence = Evidence(LayerAccumulator(reference.n_layers))
    bucket_of_position = bucket_index(span, span, n_buckets)
    for w, window in enumerate(wins):
        ids = torch.tensor(window.ids)
        sides = [reference.steps(window.ids, chunk), control.steps(window.ids, chunk)]
        if target is not None:
            sides.append(target.steps(window.ids, chunk))
        for steps in zip(*sides):
            r, c = steps[0], steps[1]
            t = steps[2] if target is not None else c
            length = r.logits.shape[0]
            pos = torch.arange(r.start, r.start + length)
            scored = pos >= window.score_from
            has_next = pos < len(window.ids) - 1
            nxt = torch.where(has_next, ids[(pos + 1).clamp(max=len(window.ids) - 1)], 0)
            evidence.logits.add(r.logits, c.logits, t.logits, nxt, scored, has_next)
            evidence.layers.add(r.hidden, c.hidden, t.hidden, scored)
            evidence.routers.add(r.routes, c.routes, t.routes, scored)
            evidence.window_of.append(torch.full((int(scored.sum()),), w))
            evidence.bucket_of.append(bucket_of_position[pos][scored])
            evidence.position_of.append(pos[scored])
            reached = r.start + length
            stage_progress.update("windows", w + (reached == len(window.ids)), len(wins),
                                  detail=f"window {w + 1}: positions {reached}/{len(window.ids)}",
                                  fraction=(w + reached / len(window.ids)) / len(wins))
            if len(window.ids) > chunk:
                progress(f"window {w + 1}/{len(wins)}: positions {reached} of "
                         f"{len(window.ids)}")
    return evidence


__all__ = ["Side", "KeptSide", "Evidence", "evaluate"]
