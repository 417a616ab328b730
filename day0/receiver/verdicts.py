"""A release the receiver gave up on still ends in a published verdict.

After submit.crash_attempts crashed runs in a row (the run's process or machine died each time:
no run wrote a report), the receiver publishes the release's ERROR report itself, naming every
attempt, under the release's results folder with latest.json pointing at it, as a run would
(day0.rendering.publish: the store's own retries, then the outbox that `day0 serve` and `day0
stack up` drain). The journal records where, so a receiver restarted in between publishes it
then. It publishes with the results store of its environment (DAY0_RESULTS_URI, the DAY0_S3_*
variables), the same the worker's runs use.
"""

from __future__ import annotations

import logging

from day0.execution.targets import REFERENCE, resolve_target
from day0.rendering.publish import publish_to_store
from day0.store import identity
from day0.verdict import report as reports

log = logging.getLogger("day0.receiver")


def publish_gave_up(row: dict) -> str:
    """Publish the ERROR verdict of a given-up release (a journal row: model, revision, target,
    source, last_error); returns where it went (run folder, or why it waits in the outbox)."""
    report = reports.gave_up(
        source=row["source"], target=resolve_target(row["target"]), reference=REFERENCE,
        error=row["last_error"],
        identity={"model": row["model"], "revision": row["revision"],
                  "run_id": identity.new_run_id()})
    where = publish_to_store(report, log=log)
    if where is None and not report.unpublished:
        return "no results store for this source (a local path without DAY0_RESULTS_URI)"
    return where or f"outbox: {report.unpublished}"
