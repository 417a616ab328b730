"""The alignment stage for models that do not fit: every side streamed, layer-major.

Each layer is read once per side and run on every window before the next layer is read; the
per-layer comparison is accumulated as soon as all sides have run the layer, so only one
layer's hidden states per side and window are held. Logits are computed per position chunk at
the end (the head read in row blocks). The numbers equal the resident path's for windows of at
most ``chunk_tokens`` positions (test_streamed.py); a longer window is one forward here and
KV-cache chunks there, which differ by float rounding only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from day0.execution import progress as stage_progress
from day0.errors import ConfigError, TargetFault
from day0.stages.alignment.engine import Evidence
from day0.stages.alignment.layers import Capture, LayerAccumulator
from day0.stages.alignment.logits import bucket_index
from day0.torchkit.evaltext import Window
from day0.torchkit.dtypes import torch_dtype
from day0.torchkit.streamed import StreamedModel, greedy


NOTE = ("streamed: reference, control and target ran layer by layer, each layer read from the "
        "shards when needed; every window is one forward (no KV-cache chunks)")
# coefficients shared with the analysis stage's estimate (resident_slack: activations, allocator)
STREAMING_FILE = Path(__file__).resolve().parents[2] / "data" / "streaming.yaml"


def resident_fits(source: str, dtypes: list[str]) -> bool:
    """Whether the model copies in ``dtypes`` fit in the memory available now."""
    from day0.execution import memory
    from day0.checkpoint.headers import read_checkpoint
    from day0.yamlio import read_mapping

    params = sum(t.numel for t in read_checkpoint(source).tensors.values())
    need = sum(params * torch_dtype(d).itemsize for d in dtypes)
    available = memory.available_bytes()
    return available is None or need * read_mapping(STREAMING_FILE)["resident_slack"] <= available


def side(name: str, inputs, profile, expert_group_bytes: int, store) -> "StreamedSide":
    """A streamed model of the checkpoint at profile's device and dtype; store: the weight
    index shared by every side."""
    return StreamedSide(name, StreamedModel(
        inputs.source, dtype=profile.dtype, device=profile.device,
        trust_remote_code=inputs.trust_remote_code, expert_group_bytes=expert_group_bytes,
        weights=store))


def refuse_plugins() -> None:
    # a plugin may rewrite weights when applied or replace the model's forward: neither reaches
    # a model driven layer by layer from the shards, which would pass unseen
    raise ConfigError("a target with plugins cannot be streamed", field="alignment.streaming",
                      fix="set alignment.streaming: off and give the stage memory for the "
                          "resident model, or validate the target without plugins")


@dataclass
class StreamedSide:
    """One streamed model and its hooks (layer outputs, router choices), layer-major over the
    windows: prepare(wins), then per layer ``with layer(k): run(k, w)`` for every window, then
    routes(w) and logits(w, a, b)."""

    name: str
    model: StreamedModel

    def __post_init__(self):
        self.capture = Capture(self.model.model)
        self.n_layers = len(self.model.layers)
        self.batches: list = []
        self._routes: list[dict] = []

    def prepare(self, wins: list[Window]) -> None:
        self.batches = [self.model.prepare(torch.tensor([w.ids])) for w in wins]
        self._routes = [{} for _ in wins]

    def layer(self, k: int):
        # a MoE layer's experts take long to read: say how far it got
        self.model.progress = (lambda line: stage_progress.update(
            "windows", k, self.n_layers + 1,
            detail=f"layer {k + 1} of {self.n_layers}, {self.name}: {line}"))
        return self.model.layer(k)

    def run(self, k: int, w: int) -> torch.Tensor | None:
        try:
            with self.capture:
                self.model.run_layer(k, self.batches[w])
        except Exception as exc:
            if self.name != "target":
                raise
            raise TargetFault(f"target layer {k} raised {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}",
                             field="target", fix="fix the target's kernels for the failing op"
                             ) from exc
        self._routes[w].update(self.capture.routes)
        return self.capture.hidden[k]

    def routes(self, w: int) -> dict:
        return self._routes[w]

    def logits(self, w: int, a: int, b: int) -> torch.Tensor:
        return _logits(self, self.batches[w].hidden[:, a:b])


def evaluate_streamed(wins: list[Window], reference, control, target, *, span: int,
                      n_buckets: int, logit_chunk: int = 1024, progress=print) -> Evidence:
    """Evidence like engine.evaluate's; target None: the target is the control itself.
    reference and control: StreamedSides, or a bank's (banked.BankSide, banked.Recorder)."""
    sides = [reference] + ([control] if control is not reference else []) \
        + ([target] if target is not None else [])
    tgt = target or control
    n_layers = reference.n_layers
    evidence = Evidence(LayerAccumulator(n_layers))
    for side in sides:
        side.prepare(wins)
    scored = [torch.arange(len(w.ids)) >= w.score_from for w in wins]
    slots = [evidence.layers.open(mask) for mask in scored]
    started = time.monotonic()
    for k in range(n_layers):
        hidden = {}
        for side in sides:
            with side.layer(k):
                for w in range(len(wins)):
                    hidden[side.name, w] = side.run(k, w)
        for w in range(len(wins)):
            evidence.layers.fill(slots[w], k, hidden[reference.name, w], hidden[control.name, w],
                                 hidden[tgt.name, w], scored[w])
        del hidden
        elapsed = time.monotonic() - started
        line = (f"layer {k + 1} of {n_layers}, {len(sides)} side(s), {len(wins)} window(s): "
                f"{elapsed:.0f} s, about {elapsed / (k + 1) * (n_layers - k - 1):.0f} s left")
        stage_progress.update("windows", k + 1, n_layers + 1, detail=line)
        progress(line)
    bucket_of_position = bucket_index(span, span, n_buckets)
    for w, window in enumerate(wins):
        routes = {side.name: side.routes(w) for side in sides}
        evidence.routers.add(routes[reference.name], routes[control.name], routes[tgt.name],
                             scored[w])
        ids = torch.tensor(window.ids)
        length = len(window.ids)
        for a in range(0, length, logit_chunk):
            b = min(length, a + logit_chunk)
            pos = torch.arange(a, b)
            logits = {s.name: s.logits(w, a, b) for s in sides}
            has_next = pos < length - 1
            nxt = torch.where(has_next, ids[(pos + 1).clamp(max=length - 1)], 0)
            evidence.logits.add(logits[reference.name], logits[control.name], logits[tgt.name],
                                nxt, scored[w][a:b], has_next)
        evidence.window_of.append(torch.full((int(scored[w].sum()),), w))
        evidence.bucket_of.append(bucket_of_position[torch.arange(length)][scored[w]])
        evidence.position_of.append(torch.arange(length)[scored[w]])
        stage_progress.update("windows", n_layers + (w + 1) / len(wins), n_layers + 1,
                              detail=f"logits of window {w + 1} of {len(wins)}")
    return evidence


def _logits(side: StreamedSide, hidden: torch.Tensor) -> torch.Tensor:
    try:
        return side.model.logits(hidden)[0].detach().to("cpu", torch.float32)
    except Exception as exc:
        if side.name != "target":
            raise
        raise TargetFault(f"target head raised {type(exc).__name__}: {exc}",
                         field="target", fix="fix the target's kernels for the failing op"
                         ) from exc


def streamed_greedy(model, batch, new_tokens: int, device: str, pad) -> list:
    """gen.greedy's signature for a streamed model (device and pad are the model's own)."""
    return greedy(model, batch, new_tokens)


__all__ = ["StreamedSide", "evaluate_streamed", "streamed_greedy", "side", "refuse_plugins",
           "resident_fits",
           "NOTE"]
