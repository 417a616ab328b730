"""A verdict the results store did not take is never a plain success (issue 28): the run ends
Failed "NOT PUBLISHED" (a state that carries a report), `day0 validate` exits non-zero with one
line saying so and where the report is kept; a run with no results store is as before."""

from __future__ import annotations

import pytest

from day0.execution.stage import StageOutcome
from day0.execution.targets import REFERENCE, resolve_target
from day0.rendering import labels
from day0.verdict.gates import GateResult
from day0.verdict.report import build
from tests.conftest import MODELS

WHY = ("cannot reach the S3 endpoint http://127.0.0.1:8333 (EndpointConnectionError); kept in "
       "/state/day0/outbox/20260101T120000Z-0123abcd, published to s3://m/day0-results/x/ once "
       "the store answers")


def _report(verdict: str, unpublished: str | None = None):
    report = build(source=str(MODELS / "tiny-llama"), target=resolve_target("cpu-bf16"),
                   reference=REFERENCE, verdict=verdict, gate_results=[GateResult(
                       id="g", metric="analysis.params", op=">=", observed=1.0, threshold=0.0,
                       passed=verdict == "PASS", severity="error", reason="1.0 >= 0.0")],
                   outcomes={"analysis": StageOutcome(stage="analysis", ok=True, result={})})
    report.unpublished = unpublished
    return report


def test_an_unpublished_verdict_ends_not_published():
    from prefect.states import Failed

    from flows.results import is_verdict

    end = labels.final_state(_report("PASS", WHY))
    assert (end.completed, end.name) == (False, labels.NOT_PUBLISHED)
    assert end.message.startswith("PASS, not published: cannot reach the S3 endpoint")
    assert "outbox/20260101T120000Z-0123abcd" in end.message  # where it is kept survives
    assert labels.final_state(_report("PASS")).name == "PASS"
    assert is_verdict(Failed(name=labels.NOT_PUBLISHED))


@pytest.mark.parametrize("verdict, unpublished, code", [
    ("PASS", WHY, 3), ("FAIL", WHY, 1), ("PASS", None, 0)])
def test_validate_exits_non_zero_with_one_line(monkeypatch, capsys, verdict, unpublished, code):
    from day0 import cli
    from day0.orchestration import local

    report = _report(verdict, unpublished)
    monkeypatch.setattr(local, "warm_up", lambda request: None)
    monkeypatch.setattr(local, "validate", lambda request: report.model_dump(mode="json"))
    assert cli.main(["validate", str(MODELS / "tiny-llama")]) == code
    err = [line for line in capsys.readouterr().err.splitlines() if "not published" in line]
    assert err == ([f"day0: error: the report was not published: {WHY}"] if unpublished else [])


def test_no_results_store_publishes_nothing_and_stays_as_before(monkeypatch):
    from day0.rendering.publish import publish_to_store

    monkeypatch.delenv("DAY0_RESULTS_URI", raising=False)
    report = _report("PASS")
    assert publish_to_store(report) is None
    assert report.results_uri is None and report.unpublished is None
    assert labels.final_state(report).name == "PASS"
