"""Every error day0 raises on purpose, in one place.

Hierarchy::

    Day0Error                  base; carries file, field and fix; exit code 2
    ├── ConfigError            gates.yaml, targets.yaml, stage configs (may bundle many problems)
    ├── InputError             a SOURCE that cannot be read (missing path, bad config.json)
    │   └── CheckpointError    headers, index and config disagree (names file and tensor)
    ├── PluginError            a target plugin cannot be imported or has no apply(model)
    ├── TargetFault            the target itself failed (its forward raised, ...): FAIL, exit 1
    ├── StageError             a stage could not finish (crash, timeout, out of memory, its own
    │   │                      bug): ERROR, exit code 3
    │   └── StoreDown          the object store did not answer for the bounded time reads and
    │                          publishing wait (day0.store.retry); names the endpoint
    ├── StackError             `day0 stack`: a process of the hand-run stack did not start or
    │                          stop (names it): exit code 3
    └── ReceiverError          the release receiver refuses a request or cannot serve it now;
        │                      ``status`` is its HTTP answer, ``reason`` safe to show the sender
        ├── BadRequest         400/409/413/422: the body or a field is wrong (status given)
        ├── AuthError          401: not authenticated
        ├── TooLarge           413: the body is over max_body_bytes
        ├── ClientGone         400: the client left before its body ended
        └── Unavailable        503 + Retry-After: what the answer depends on cannot answer now
            ├── StoreError     the object store (down, denied, throttled): checked again later
            └── JournalError   the receiver's journal (SQLite) could not be read or written

The exit codes of `day0 validate` (docs/errors-and-exit-codes.md): 0 PASS, 1 FAIL (TargetFault
and every other finding about the target), 2 bad input or config (Day0Error's default), 3 ERROR
(StageError), 4 an internal day0 bug (any other exception), 5 BROKEN (the checkpoint itself).

The CLI turns any Day0Error into one line on stderr (``str(err)``) and its ``exit_code``;
nothing else reaches the user as a traceback. That line is bounded (``MAX_MESSAGE`` characters):
inputs are untrusted, and a header with 100,000 bad entries must not become a 20 MB message, so
each part is shortened in the middle and extra problems become "and N more" (``problems`` keeps
them all).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MAX_MESSAGE = 486  # str(err); "day0: error: " + this stays under 500 characters
# most characters each part of a problem keeps when the line is too long; file and fix survive
PART_LIMITS = {"file": 110, "field": 70, "message": 150, "fix": 90}


def shorten(text, limit: int, *, tail: float = 1 / 3) -> str:
    """text on one line, at most limit characters: the middle is cut when it is longer, keeping
    the given share of the end (a path's file name is at its end, a message's point at its start)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    keep = limit - 5
    end = int(keep * tail)
    return f"{text[:keep - end]} ... {text[len(text) - end:]}"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where it is, what is wrong, how to fix it."""

    message: str
    file: str | None = None
    field: str | None = None
    fix: str | None = None

    def __str__(self) -> str:
        return self.render()

    def render(self, limit: int | None = None) -> str:
        """As written; with a limit, on one line, and past it each part is shortened to its
        PART_LIMITS share."""
        if limit is None:
            return self._line(lambda key, text: text)
        line = self._line(lambda key, text: " ".join(str(text).split()))
        if len(line) <= limit:
            return line
        return self._line(lambda key, text: shorten(text, PART_LIMITS[key],
                                                    tail=0.7 if key == "file" else 1 / 3))

    def _line(self, cut) -> str:
        part = {k: cut(k, getattr(self, k)) if getattr(self, k) else None
                for k in ("file", "field", "message", "fix")}
        where = ": ".join(p for p in (part["file"], part["field"]) if p)
        text = f"{where}: {part['message']}" if where else part["message"]
        if part["fix"]:
            text += f" (fix: {part['fix']})"
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
        first = self.problems[0]
        if len(self.problems) == 1:
            return first.render(MAX_MESSAGE)
        folder = first.file.rsplit("/", 1)[0] + "/" if first.file and "/" in first.file else None
        head = f"{len(self.problems)} problems: "
        text, shown = head + first.render(MAX_MESSAGE - len(head) - 20), 1  # 20: "; and N more"
        for problem in self.problems[1:]:
            # the folder and a fix the first problem gave are said once
            if folder and problem.file and problem.file.startswith(folder):
                problem = replace(problem, file=problem.file[len(folder):])
            if problem.fix == first.fix:
                problem = replace(problem, fix=None)
            left = len(self.problems) - shown - 1
            more = f"; and {left} more" if left else ""
            line = problem.render(MAX_MESSAGE // 2)
            if len(text) + 2 + len(line) + len(more) > MAX_MESSAGE:
                break
            text, shown = f"{text}; {line}", shown + 1
        if shown < len(self.problems):
            text += f"; and {len(self.problems) - shown} more"
        return text

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


class TargetFault(Day0Error):
    """The target under test failed (its forward raised, its kernels are missing): evidence
    against the target, so its gates FAIL; not a broken stage."""

    exit_code = 1


class StageError(Day0Error):
    """A stage did not produce a result: it crashed, timed out, exhausted memory or broke."""

    exit_code = 3


class StoreDown(StageError):
    """The object store could not answer (refused, timed out, 5xx) for as long as day0 waits
    for it (day0/data/store.yaml): the store's trouble, never a finding about the target."""


class StackError(Day0Error):
    """A process of the hand-run stack (day0.stack) did not become healthy or did not stop."""

    exit_code = 3


class ReceiverError(Day0Error):
    """A request the release receiver refuses or cannot serve now (day0.receiver.app answers
    ``status`` with ``{"detail": reason}`` and ``headers``); the reason is safe to show."""

    status = 400
    headers: dict[str, str] = {}

    def __init__(self, reason: str, *, status: int | None = None):
        super().__init__(reason)
        self.reason = reason
        if status is not None:
            self.status = status


class BadRequest(ReceiverError):
    """Bad input: `status` (400, 409, 413 or 422) and a reason safe to show the sender."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason, status=status)


class AuthError(ReceiverError):
    """The request is not authenticated."""

    status = 401
    headers = {"WWW-Authenticate": "Bearer"}


class TooLarge(ReceiverError):
    """The body is larger than the receiver accepts; the connection is closed after the answer."""

    status = 413
    headers = {"Connection": "close"}


class ClientGone(ReceiverError):
    """The client closed the connection (or missed the body deadline) before its body ended."""


class Unavailable(ReceiverError):
    """What the answer depends on cannot answer now (503 with Retry-After; the sender retries)."""

    status = 503
    headers = {"Retry-After": "5"}


class StoreError(Unavailable):
    """The object store could not be read (down, denied, throttled); the check is retried later."""


class JournalError(Unavailable):
    """The receiver's journal could not be read or written (disk full, locked, corrupt)."""


def did_you_mean(word: str, choices) -> str:
    """A ' did you mean X?' suffix, or '' when nothing is close."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" did you mean '{close[0]}'?" if close else ""
