"""A running stage's progress in Prefect: one progress artifact per stage, readable log lines.

The stage child prints ``day0-progress {...}`` lines (day0.execution.progress); every runner streams them
with the stage's log to ``StageProgress.line``, which keeps them out of the run's log, updates
the stage's progress artifact (at most once a second) and logs a readable line at most every
``log_every_s`` (and when a part finishes). Other lines are logged as they come.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Callable

from day0.execution import progress

LOG_EVERY_S = 10.0
UPDATE_EVERY_S = 1.0


def artifact_key(stage: str) -> str:
    """'day0-progress-<stage>': artifact keys take lowercase letters, digits and dashes."""
    return "day0-progress-" + (re.sub(r"[^a-z0-9-]+", "-", stage.lower()).strip("-") or "stage")


class StageProgress:
    """The progress artifact and log of one running stage (thread-safe: the runner's reader
    thread feeds lines while its supervising thread may log heartbeats)."""

    def __init__(self, stage: str, logger, *, clock: Callable[[], float] = time.monotonic,
                 log_every_s: float = LOG_EVERY_S, update_every_s: float = UPDATE_EVERY_S,
                 artifacts: bool = True):
        self.stage, self.logger, self.clock = stage, logger, clock
        self.log_every_s, self.update_every_s = log_every_s, update_every_s
        self.latest: progress.Progress | None = None
        self.percent = 0.0
        self.artifact_id = None
        self._lock = threading.Lock()
        self._logged = self._updated = -float("inf")
        if artifacts:
            self._call("create", lambda: self._create(f"{stage}: started"))

    def line(self, line: str) -> None:
        """The runner's log callback."""
        found = progress.parse(line)
        if found is None:
            self.logger.info("[%s] %s", self.stage, line)
            return
        with self._lock:
            self.latest = found
            if found.overall is not None:
                self.percent = max(self.percent, found.overall)  # parts never move it back
            now = self.clock()
            finished = found.total is not None and found.done >= found.total
            if finished or now - self._logged >= self.log_every_s:
                self._logged = now
                self.logger.info("[%s] progress: %s", self.stage, self.describe())
            if finished or now - self._updated >= self.update_every_s:
                self._flush(now)

    def describe(self) -> str:
        part = self.latest.describe() if self.latest else "started"
        return f"{part}, {self.percent:.0f} %"

    def finish(self, ok: bool, note: str = "") -> None:
        """100 % when the stage succeeded; a failed stage keeps how far it got."""
        with self._lock:
            if ok:
                self.percent = 100.0
            text = f"{self.stage}: {'done' if ok else 'failed'}" + (f" ({note})" if note else "")
            if not ok and self.latest:
                text += f" at {self.latest.describe()}"
            self._call("update", lambda: self._update(text))

    def _flush(self, now: float) -> None:
        self._updated = now
        self._call("update", lambda: self._update(f"{self.stage}: {self.describe()}"))

    def _create(self, description: str) -> None:
        from prefect.artifacts import create_progress_artifact

        self.artifact_id = create_progress_artifact(
            self.percent, key=artifact_key(self.stage), description=description)

    def _update(self, description: str) -> None:
        from prefect.artifacts import update_progress_artifact

        if self.artifact_id is not None:
            update_progress_artifact(self.artifact_id, self.percent, description=description)

    def _call(self, what: str, action: Callable[[], None]) -> None:
        # progress is a courtesy: an API hiccup never fails the stage; said once, then dropped
        if self.artifact_id is None and what == "update":
            return
        try:
            action()
        except Exception as exc:
            self.logger.warning("stage %s: progress artifact %s failed (%s: %s); no further "
                                "progress updates", self.stage, what, type(exc).__name__, exc)
            self.artifact_id = None


__all__ = ["StageProgress", "artifact_key", "LOG_EVERY_S"]
