"""Durations as people write them: 10h, 30m, 1h30m, 90s, or seconds."""

from __future__ import annotations

import re

DURATION_RE = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*"
                         r"(?:(\d+(?:\.\d+)?)s?)?\s*$")


def seconds(value: str | float | int) -> float:
    """'10h', '90m', '1h30m', '45s', '45' or a number: seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    match = DURATION_RE.match(str(value))
    if not match or not any(match.groups()):
        raise ValueError(f"{value!r} is not a duration; write e.g. 10h, 30m, 1h30m, 90s")
    h, m, s = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + s


def positive_seconds(value: str | float | int) -> float:
    """seconds(value), which must be positive (a load that lasts no time measures nothing)."""
    if (out := seconds(value)) <= 0:
        raise ValueError("it must be positive")
    return out
