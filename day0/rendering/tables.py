"""Markdown tables for the stages' report sections (report.md, Prefect artifacts)."""

from __future__ import annotations

import math


def cell(value, digits: int = 4) -> str:
    """One table cell: None as a dash, NaN/Infinity as JSON keeps them ("NaN" strings), floats
    to `digits` significant digits, booleans as yes/no; '|' and newlines escaped."""
    if value is None:
        text = "—"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = str(value) if not math.isfinite(value) else f"{value:.{digits}g}"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table(head: list[str], rows: list[list]) -> str:
    """A markdown table, or '_none_' without rows."""
    if not rows:
        return "_none_\n"
    lines = ["| " + " | ".join(h.replace("|", "\\|") for h in head) + " |",
             "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


__all__ = ["cell", "table", "notes_and_findings"]


def notes_and_findings(notes: list[str], findings: list[str]) -> list[str]:
    """The closing lines of a stage's report section: its notes, then its findings."""
    lines = [f"- note: {note}" for note in notes]
    if findings:
        lines += ["", *[f"- {f}" for f in findings]]
    return lines
