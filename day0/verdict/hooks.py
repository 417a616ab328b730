"""A stage's report hooks, called so that one that raises can never cost the evidence.

A validation whose stages finished has its verdict; how a stage shows its evidence (its
``facts``, ``evidence``, ``findings``, ``markdown``, ``tables``, ``plots`` and ``files`` hooks) is
presentation. A hook that raises (a formatting slip on a config nobody had seen) becomes one
note in the report ("stage X: section could not be rendered: error"), its part falls back to
the plain default (the stage's metrics, its whole result), and the verdict stands.
"""

from __future__ import annotations

from typing import Any

from day0 import stages
from day0.errors import Day0Error, shorten

# what each hook gives, as a report note names it
PARTS = {"facts": "model facts", "evidence": "evidence", "findings": "findings",
         "markdown": "report.md section", "tables": "tables", "plots": "plots",
         "files": "files"}


def stage_of(name: str):
    """The registered stage of that name; None for one no longer registered (its evidence is
    kept as it is, its hooks give nothing)."""
    try:
        return stages.get(name)
    except Day0Error:
        return None


def note(name: str, hook: str, exc: BaseException) -> str:
    return (f"stage {name}: {PARTS.get(hook, hook)} could not be rendered: "
            f"{shorten(f'{type(exc).__name__}: {exc}', 240)} (a day0 bug: the verdict stands; "
            "report it)")


def call(name: str, hook: str, *args, default: Any, notes: list[str] | None = None,
         log=None) -> Any:
    """``stage.<hook>(*args)``, or default when the stage is not registered or the hook raises
    (then a note is added to notes, once, and logged)."""
    stage = stage_of(name)
    if stage is None:
        return default
    try:
        return getattr(stage, hook)(*args)
    except Exception as exc:  # presentation only: the evidence and the verdict stand
        line = note(name, hook, exc)
        if notes is not None and line not in notes:
            notes.append(line)
        if log is not None:
            log.warning("%s", line)
        return default


__all__ = ["call", "note", "stage_of", "PARTS"]
