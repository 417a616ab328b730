"""Sides backed by the reference bank: a BankSide replays what a reference or control computed
(no forward), a Recorder passes a live side's outputs through while writing them to a bank.

Both speak the two side protocols: ``steps(ids, chunk)`` (engine.evaluate, chunk by chunk) and
``prepare/layer/run/routes/logits`` (streamed.evaluate_streamed, layer-major).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from day0.stages.alignment.bank import Bank, BankWriter, window_digest
from day0.stages.alignment.engine import Step


class BankSide:
    """A reference or control replayed from its bank part."""

    def __init__(self, name: str, bank: Bank):
        self.name, self.bank = name, bank
        self.n_layers = bank.meta.n_layers
        self.windows: list[tuple[int, int]] = []

    def _hidden(self, w: int, k: int, a: int, b: int) -> torch.Tensor | None:
        found = self.bank.rows(w, f"h{k}", a, b)
        return None if found is None else found.unsqueeze(0)  # the layer output's batch of one

    def _routes(self, w: int, a: int, b: int) -> dict:
        found = {r: self.bank.rows(w, f"r.{r}", a, b) for r in self.bank.meta.routers}
        return {r: t for r, t in found.items() if t is not None}

    def steps(self, ids: list[int], chunk: int):
        w = self.bank.window(ids)
        for a in range(0, len(ids), chunk):
            b = min(a + chunk, len(ids))
            yield Step(a, self.bank.rows(w, "logits", a, b),
                       [self._hidden(w, k, a, b) for k in range(self.n_layers)],
                       self._routes(w, a, b))

    def prepare(self, wins) -> None:
        self.windows = [(self.bank.window(win.ids), len(win.ids)) for win in wins]

    def layer(self, k: int):
        return nullcontext()

    def run(self, k: int, w: int) -> torch.Tensor | None:
        stored, length = self.windows[w]
        return self._hidden(stored, k, 0, length)

    def routes(self, w: int) -> dict:
        stored, length = self.windows[w]
        return self._routes(stored, 0, length)

    def logits(self, w: int, a: int, b: int) -> torch.Tensor:
        return self.bank.rows(self.windows[w][0], "logits", a, b)


class Recorder:
    """A live side whose outputs are also written to a bank part."""

    def __init__(self, side, writer: BankWriter, windows: list[list[int]]):
        self.side, self.writer, self.name = side, writer, side.name
        self.digests = [window_digest(ids) for ids in windows]
        self.routers: set[str] = set()

    def __getattr__(self, attr):  # model, capture, n_layers...: the live side's
        return getattr(self.side, attr)

    def _hidden(self, w: int, k: int, a: int, hidden) -> None:
        if hidden is None:
            return  # not a tensor output: the bank has none either, as the live run had none
        if hidden.dim() != 3 or hidden.shape[0] != 1:
            self.writer.unsupported = f"layer {k} outputs shape {tuple(hidden.shape)}"
            return
        self.writer.add(f"w{w}/h{k}/{a}", hidden[0])

    def _routes(self, w: int, a: int, positions: int, routes: dict) -> None:
        for name, chosen in routes.items():
            if chosen.shape[0] != positions:
                self.writer.unsupported = f"router {name} has {chosen.shape[0]} rows"
                continue
            self.routers.add(name)
            self.writer.add(f"w{w}/r.{name}/{a}", chosen)

    def steps(self, ids: list[int], chunk: int):
        w = self.digests.index(window_digest(ids))
        for step in self.side.steps(ids, chunk):
            self.writer.add(f"w{w}/logits/{step.start}", step.logits)
            for k, hidden in enumerate(step.hidden):
                self._hidden(w, k, step.start, hidden)
            self._routes(w, step.start, step.logits.shape[0], step.routes)
            yield step

    def prepare(self, wins) -> None:
        self.side.prepare(wins)
        self.lengths = [len(win.ids) for win in wins]

    def layer(self, k: int):
        return self.side.layer(k)

    def run(self, k: int, w: int):
        hidden = self.side.run(k, w)
        self._hidden(w, k, 0, hidden)
        return hidden

    def routes(self, w: int) -> dict:
        found = self.side.routes(w)
        self._routes(w, 0, self.lengths[w], found)
        return found

    def logits(self, w: int, a: int, b: int) -> torch.Tensor:
        found = self.side.logits(w, a, b)
        self.writer.add(f"w{w}/logits/{a}", found)
        return found


# --------------------------------------------------------------------------- recorded ops
# torch.load(weights_only=True) refuses slices, Ellipsis and memory formats: tagged instead.
_FORMATS = {str(f): f for f in (torch.contiguous_format, torch.channels_last,
                                torch.channels_last_3d, torch.preserve_format)}


def _encode(value):
    if isinstance(value, (list, tuple)):
        items = [_encode(v) for v in value]
        return items if isinstance(value, list) else {"__tuple__": items}
    if isinstance(value, dict):
        return {"__dict__": [[k, _encode(v)] for k, v in value.items()]}
    if isinstance(value, slice):
        return {"__slice__": [_encode(value.start), _encode(value.stop), _encode(value.step)]}
    if value is Ellipsis:
        return {"__ellipsis__": True}
    if isinstance(value, torch.memory_format):
        return {"__memory_format__": str(value)}
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor, torch.dtype,
                                           torch.device, torch.layout)):
        return value
    raise TypeError(f"{type(value).__name__} cannot be banked")


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if "__tuple__" in value:
            return tuple(_decode(v) for v in value["__tuple__"])
        if "__dict__" in value:
            return {k: _decode(v) for k, v in value["__dict__"]}
        if "__slice__" in value:
            return slice(*(_decode(v) for v in value["__slice__"]))
        if "__ellipsis__" in value:
            return Ellipsis
        if "__memory_format__" in value:
            return _FORMATS[value["__memory_format__"]]
    return value


def encode_ops(recorder) -> tuple[list[dict], dict] | None:
    """(op list for bank.json, examples for ops.pt) of an OpRecorder; None when an example holds
    a value that cannot be stored safely (the op check then records again)."""
    try:
        examples = {name: _encode(list(call)) for name, call in recorder.examples.items()}
    except TypeError:
        return None
    ops = [{"name": s.name, "packet": s.packet, "count": s.count, "dtypes": sorted(s.dtypes),
            "module": s.module} for s in recorder.ops.values()]
    return ops, {"examples": examples, "skipped": list(recorder.examples_skipped)}


class RecordedOps:
    """What replay_recorded reads from an OpRecorder, rebuilt from a bank."""

    def __init__(self, ops: list[dict], stored: dict):
        from day0.torchkit.opcapture import OpStats

        self.ops = {o["name"]: OpStats(o["name"], o["packet"], o["count"], set(o["dtypes"]),
                                       o["module"]) for o in ops}
        self.examples = {name: tuple(_decode(call)) for name, call in stored["examples"].items()}
        self.examples_skipped = list(stored["skipped"])


__all__ = ["BankSide", "Recorder", "encode_ops", "RecordedOps"]
