"""Sides kept across run() calls of the alignment stage in one process (KeptSides)."""

from __future__ import annotations

from day0.execution.plugins import apply_plugins
from day0.stages.alignment import generation as gen
from day0.stages.alignment.engine import KeptSide


class KeptSides:
    """Sides kept across run() calls on the same checkpoint and text (for calibration and tests
    that validate many targets): the reference and control loaded once and each window computed
    once; the last target too, so a target judged again under another claim runs nothing again.
    Not used by the stage runner, where every stage is a fresh process."""

    def __init__(self):
        self.sides: dict[tuple, KeptSide] = {}
        self.generations: dict[tuple, list] = {}

    def greedy(self, model, batch, new_tokens: int, device: str, pad) -> list:
        # kept only for models the kept holds: a freed model's id may name the next one
        if not any(side.model is model for side in self.sides.values()):
            return gen.greedy(model, batch, new_tokens, device, pad)
        key = (id(model), hash(tuple(map(tuple, batch))), new_tokens)
        if key not in self.generations:
            self.generations[key] = gen.greedy(model, batch, new_tokens, device, pad)
        return self.generations[key]

    def side(self, name: str, source: str, device: str, dtype: str, load) -> KeptSide:
        key = (name, source, device, dtype)
        if key not in self.sides:
            self.sides[key] = KeptSide(name, load(), device)
        return self.sides[key]

    def target(self, source: str, profile, load) -> KeptSide:
        """The target side with its plugins applied; only the last target is kept (a new one
        frees it and its generations first)."""
        key = ("target", source, profile.device, profile.dtype,
               tuple(plugin_key(p) for p in profile.plugins))
        if key not in self.sides:
            for old in [k for k in self.sides if k[0] == "target"]:
                gone = id(self.sides.pop(old).model)
                self.generations = {k: v for k, v in self.generations.items() if k[0] != gone}
            model = load()
            apply_plugins(model, profile.plugins)
            self.sides[key] = KeptSide("target", model, profile.device, profile.plugins)
        return self.sides[key]


def plugin_key(spec: str) -> str:
    """A file plugin by its content (edited between calls: another target), else its name."""
    from pathlib import Path

    from day0.store.identity import file_digest

    return file_digest(Path(spec)) if Path(spec).is_file() else spec


__all__ = ["KeptSides", "plugin_key"]
