"""Stage progress as structured stdout lines, their parser, and a silence heartbeat.

A stage child reports how far it is with ``update("windows", 3, 8)``; the line it prints,
``day0-progress {"stage": "alignment", "what": "windows", "done": 3, "total": 8, ...}``, travels
with the stage's log through every runner (subprocess pipe, container logs) and the Prefect
task turns it into a progress artifact (``parse``). Outside a stage child (``day0 scan --json``,
calibration, tests calling ``run`` directly) ``update`` prints nothing: ``start`` arms it.

Lines are rate-limited per ``what`` (at most one per ``min_interval_s``); the last state of a
``what`` is never dropped (a finished one prints at once, a held-back one at ``stop``).
Reporting reads counters only: it never touches a tensor, so no metric can change.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, TextIO

PREFIX = "day0-progress "
MAX_LINE = 2000            # longer lines are not progress (container output is untrusted)
HEARTBEAT_S = 10.0


@dataclass(frozen=True)
class Progress:
    """One progress report of a stage."""

    stage: str
    what: str
    done: float
    total: float | None = None
    detail: str | None = None
    percent: float | None = None   # of the whole stage, when the stage planned its phases

    @property
    def overall(self) -> float | None:
        """0-100: the stage's own estimate, else done/total of this part."""
        if self.percent is not None:
            return self.percent
        if self.total:
            return max(0.0, min(100.0, 100.0 * self.done / self.total))
        return None

    def describe(self) -> str:
        """'windows 3/8 (window 4: positions 1024/8192)'."""
        count = f"{_num(self.done)}/{_num(self.total)}" if self.total is not None else _num(self.done)
        return f"{self.what} {count}" + (f" ({self.detail})" if self.detail else "")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"


def format_line(p: Progress) -> str:
    fields = {"stage": p.stage, "what": p.what, "done": p.done, "total": p.total,
              "detail": p.detail, "percent": None if p.percent is None else round(p.percent, 1)}
    return PREFIX + json.dumps({k: v for k, v in fields.items() if v is not None})


def parse(line: str) -> Progress | None:
    """The Progress a log line carries, or None (any other line, or a malformed one)."""
    # a progress bar's unterminated "\r..." may precede it on the same line: read from the prefix
    at = line.rfind(PREFIX)
    line = line[at:].strip() if at >= 0 else ""
    if not line or len(line) > MAX_LINE:
        return None
    try:
        data = json.loads(line[len(PREFIX):])
        stage, what, done = data["stage"], data["what"], float(data["done"])
        total = None if data.get("total") is None else float(data["total"])
        percent = None if data.get("percent") is None else float(data["percent"])
        detail = data.get("detail")
        if not (isinstance(stage, str) and isinstance(what, str)
                and (detail is None or isinstance(detail, str))):
            return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return Progress(stage, what, done, total, detail, percent)


class Reporter:
    """Rate-limited progress lines of one stage. ``plan`` names the stage's parts in order
    with weights so each line also carries the percent of the whole stage."""

    def __init__(self, stage: str, *, out: TextIO | None = None, min_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.stage, self.out, self.min_interval_s, self.clock = stage, out, min_interval_s, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, Progress] = {}
        self._phases: dict[str, float] = {}
        self._fraction: dict[str, float] = {}
        self._lock = threading.Lock()

    def plan(self, phases: dict[str, float]) -> None:
        self._phases = {k: float(v) for k, v in phases.items() if v > 0}

    def update(self, what: str, done: float, total: float | None = None, *,
               detail: str | None = None, fraction: float | None = None) -> None:
        """fraction: how far `what` is (0-1) when done/total alone does not say (chunks)."""
        if fraction is None and total:
            fraction = done / total
        with self._lock:
            if fraction is not None:
                self._fraction[what] = max(0.0, min(1.0, fraction))
            p = Progress(self.stage, what, done, total, detail, self._percent(what))
            now = self.clock()
            last = self._last.get(what)
            finished = total is not None and done >= total
            if last is not None and now - last < self.min_interval_s and not finished:
                self._held[what] = p   # printed later unless a newer one replaces it
                return
            self._held.pop(what, None)
            self._last[what] = now
            self._write(p)

    def flush(self) -> None:
        with self._lock:
            for what, p in list(self._held.items()):
                self._last[what] = self.clock()
                self._write(p)
            self._held.clear()

    def _percent(self, what: str) -> float | None:
        if what not in self._phases:
            return None
        names = list(self._phases)
        reached = names.index(what)
        done = 0.0
        for i, name in enumerate(names):
            # a part before the current one is over, even when it never reported (skipped)
            share = 1.0 if i < reached else self._fraction.get(name, 0.0) if i == reached else 0.0
            done += self._phases[name] * share
        return 100.0 * done / sum(self._phases.values())

    def _write(self, p: Progress) -> None:
        out = self.out or sys.stdout
        try:
            out.write(format_line(p) + "\n")
            out.flush()
        except (OSError, ValueError):  # a closed pipe must not fail the stage
            pass


_current: Reporter | None = None


def start(stage: str, **kwargs) -> Reporter:
    """Arm update() for this process (the stage child does this before the stage runs)."""
    global _current
    _current = Reporter(stage, **kwargs)
    return _current


def stop() -> None:
    global _current
    if _current is not None:
        _current.flush()
    _current = None


def plan(phases: dict[str, float]) -> None:
    if _current is not None:
        _current.plan(phases)


def update(what: str, done: float, total: float | None = None, *, detail: str | None = None,
           fraction: float | None = None) -> None:
    """Report progress of the running stage; nothing outside a stage child."""
    if _current is not None:
        _current.update(what, done, total, detail=detail, fraction=fraction)


class Heartbeat:
    """A line when a stage has been silent for `every_s`: its elapsed time and memory.

    The runner calls ``seen()`` for every line of the stage and ``tick()`` as often as it likes
    (run_stage's supervision loop polls every 0.1 s; ``ticking()`` runs a thread for runners
    without a loop); at most one line per `every_s`, none while the stage talks."""

    def __init__(self, stage: str, log: Callable[[str], None], *, every_s: float = HEARTBEAT_S,
                 rss: Callable[[], int | None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.stage, self.log, self.every_s, self.rss, self.clock = stage, log, every_s, rss, clock
        self.started = self.last_line = self.last_beat = clock()
        self.last_progress: Progress | None = None

    def seen(self, line: str | None = None) -> None:
        self.last_line = self.clock()
        if line and (p := parse(line)) is not None:
            self.last_progress = p

    def tick(self, rss_bytes: int | None = None) -> bool:
        now = self.clock()
        if now - max(self.last_line, self.last_beat) < self.every_s:
            return False
        self.last_beat = now
        if rss_bytes is None and self.rss is not None:
            try:
                rss_bytes = self.rss()
            except Exception:  # memory is a courtesy here
                rss_bytes = None
        memory = f", RSS {rss_bytes / 2**30:.2f} GiB" if rss_bytes else ""
        where = f", last progress: {self.last_progress.describe()}" if self.last_progress else ""
        self.log(f"[heartbeat] stage {self.stage} still running: {now - self.started:.0f} s "
                 f"elapsed, silent {now - self.last_line:.0f} s{memory}{where}")
        return True

    def ticking(self, interval_s: float = 1.0) -> "_Ticker":
        """``with beat.ticking(): ...`` ticks from a daemon thread until the block ends."""
        return _Ticker(self, interval_s)


class _Ticker:
    def __init__(self, beat: Heartbeat, interval_s: float):
        self.beat, self.interval_s = beat, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="day0-heartbeat")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat.tick()
            except Exception:  # a broken log sink must not take the runner down
                pass

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self.beat

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


__all__ = ["PREFIX", "HEARTBEAT_S", "Progress", "Reporter", "Heartbeat", "parse",
           "format_line", "start", "stop", "plan", "update"]
