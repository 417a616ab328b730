"""How a validation run is labelled in the orchestrator: its name, tags, artifact keys and final
state, decided here without Prefect (flows/validate.py and tasks/artifacts.py apply them).

* name ``<model>@<revision> on <target>``, the target as resolved (a target file's profile name);
* tags ``model:…``, ``revision:…``, ``target:…`` and, at the end, ``verdict:…``;
* artifact keys ``day0-<kind>-<model>-<target>``: the same key for every run of a model on a
  target, so Prefect's Artifacts page keeps a history per (model, target);
* the final state: PASS is Completed named "PASS"; FAIL, ERROR and BROKEN are Failed named after
  the verdict. ERROR is Failed, not Crashed: Prefect keeps Crashed for a run whose own process or
  infrastructure died (day0's housekeeping sets that for a killed `day0 validate`), while a stage
  that could not finish is a finding the flow reports with a verdict. The message is the report's
  headline (the verdict and the first failing gate, the broken stage or checkpoint problem).
* a run whose report the results store did not take (Report.unpublished: kept in the outbox)
  is not Completed whatever its verdict: Failed named "NOT PUBLISHED", its message the verdict,
  why and where the files are kept. Once the outbox is drained, the run is set to its verdict's
  state (day0.orchestration.outbox), so Prefect never shows a verdict the store does not hold.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from day0.errors import shorten

VERDICT_TAG, MODEL_TAG, REVISION_TAG, TARGET_TAG = "verdict:", "model:", "revision:", "target:"
TAG_PREFIXES = (VERDICT_TAG, MODEL_TAG, REVISION_TAG, TARGET_TAG)
VERDICTS = ("PASS", "FAIL", "ERROR", "BROKEN")
NOT_PUBLISHED = "NOT PUBLISHED"  # a verdict the results store does not hold yet
KEY_MAX = 100  # keeps keys readable in the UI; longer ones end in a digest


def run_name(model: str, revision: str, target: str) -> str:
    return f"{model}@{revision} on {target}"


BRING_UP_TAG = "bring-up"  # weights declared untrained: the run is no release verdict
PARTIAL_TAG = "partial"  # some stages not selected: a verdict over what ran


def run_tags(model: str, revision: str, target: str, verdict: str | None = None,
             bring_up: bool = False, partial: bool = False) -> list[str]:
    tags = [MODEL_TAG + model, REVISION_TAG + revision, TARGET_TAG + target]
    return (tags + ([VERDICT_TAG + verdict] if verdict else []) + [BRING_UP_TAG] * bring_up
            + [PARTIAL_TAG] * partial)


def merge_tags(existing: list[str], ours: list[str]) -> list[str]:
    """Existing tags with ours replacing any of the same prefix (update_flow_run replaces all)."""
    prefixes = tuple(t.split(":", 1)[0] + ":" for t in ours if ":" in t)
    return [t for t in existing if not t.startswith(prefixes) and t not in ours] + ours


def slug(text: str) -> str:
    """Lowercase letters, digits and single dashes (Prefect's rule for artifact keys)."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", str(text).lower())).strip("-") or "x"


def artifact_key(kind: str, model: str, target: str) -> str:
    """``day0-<kind>-<model>-<target>``, slugged; one key per (model, target): a history."""
    key = slug(f"day0-{kind}-{model}-{target}")
    if len(key) > KEY_MAX:
        digest = hashlib.sha256(key.encode()).hexdigest()[:10]
        key = key[:KEY_MAX - 11].rstrip("-") + "-" + digest
    return key


@dataclass(frozen=True)
class FinalState:
    completed: bool  # Completed when True, else Failed
    name: str
    message: str


def final_state(report) -> FinalState:
    """The state a run of `report` (day0.verdict.report.Report) ends in: its verdict's, or
    Failed "NOT PUBLISHED" while the store does not hold it."""
    from day0.rendering.report import headline

    if report.unpublished:
        return FinalState(False, NOT_PUBLISHED, shorten(
            f"{report.verdict}, not published: {report.unpublished}", 400, tail=0.6))
    return FinalState(completed=report.verdict == "PASS", name=report.verdict,
                      message=shorten(headline(report), 400))


def stage_state(failure: str | None, error: str | None, stage: str) -> FinalState:
    """The state of a stage's task run that did not finish: FAIL when the target raised (a
    finding against the target), ERROR otherwise (the stage could not finish)."""
    name = "FAIL" if failure == "target" else "ERROR"
    return FinalState(False, name, shorten(f"stage {stage}: {error or failure or 'failed'}", 400))


__all__ = ["BRING_UP_TAG", "PARTIAL_TAG", "run_name", "run_tags", "merge_tags", "slug", "artifact_key", "FinalState",
           "final_state", "stage_state", "TAG_PREFIXES", "VERDICTS", "NOT_PUBLISHED"]
