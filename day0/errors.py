"""Every error day0 raises on purpose, in one place.

Hierarchy::

    Day0Error                  base; carries file, field and fix; exit code 2
    ├── ConfigError            gates.yaml, targets.yaml, stage configs (may bundle many problems)
    ├── InputError             a SOURCE that cannot be read (missing path, bad config.json)
    │   └── CheckpointError    headers, index and config disagree (names file and tensor)
    ├── PluginError            a target plugin cannot be imported or has no apply(model)
    └── StageError             a stage crashed, timed out or ran out of memory; exit code 3

The CLI turns any Day0Error into one line on stderr (``str(err)``) and its ``exit_code``;
nothing else reaches the user as a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where it is, what is wrong, how to fix it."""

    message: str
    file: str | None = None
    field: str | None = None
    fix: str | None = None

    def __str__(self) -> str:
        where = ": ".join(p for p in (self.file, self.field) if p)
        text = f"{where}: {self.message}" if where else self.message
        if self.fix:
            text += f" (fix: {self.fix})"
        return text


class Day0Error(Exception):
    """Base of all deliberate day0 errors."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 fix: str | None = None, problems: list[Problem] | None = None):
        self.problems = problems or [Problem(message, file=file, field=field, fix=fix)]
        self.file, self.field, self.fix = file, field, fix
        super().__init__(message)

    def __str__(self) -> str:
        if len(self.problems) == 1:
            return str(self.problems[0])
        return f"{len(self.problems)} problems: " + "; ".join(str(p) for p in self.problems)

    @classmethod
    def from_problems(cls, problems: list[Problem]) -> "Day0Error":
        return cls(problems[0].message, file=problems[0].file, field=problems[0].field,
                   fix=problems[0].fix, problems=problems)


class ConfigError(Day0Error):
    """A configuration file (gates, targets, stage config) is invalid."""


class InputError(Day0Error):
    """The model SOURCE cannot be used."""


class CheckpointError(InputError):
    """The checkpoint's safetensors headers, index and config.json disagree."""


class PluginError(Day0Error):
    """A target plugin cannot be loaded or does not expose ``apply(model)``."""


class StageError(Day0Error):
    """A stage did not produce a result: it crashed, timed out or exhausted memory."""

    exit_code = 3


def did_you_mean(word: str, choices) -> str:
    """A ' did you mean X?' suffix, or '' when nothing is close."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" did you mean '{close[0]}'?" if close else ""
