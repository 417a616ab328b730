"""Once the outbox has published a run, Prefect shows its verdict (issue 28): the flow run goes
from Failed "NOT PUBLISHED" to the verdict's state (force: Failed -> Completed), its message
naming where the report now is and its result still readable; a run not ended yet waits for
the next drain; a run gone, or no longer "NOT PUBLISHED", is left alone; a dead API costs
nothing but a brief probe."""

from __future__ import annotations

import time
import uuid

import pytest

from day0.store import outbox

pytestmark = pytest.mark.integration


def _manifest(flow_run_id: str | None, api: str | None) -> outbox.Manifest:
    return outbox.Manifest(
        run_id="20260101T120000Z-0123abcd", source="s3://models/org/m", target="cpu-bf16",
        model="org/m", revision="r1", weights=None, results_base="s3://models/day0-results",
        endpoint=None, run_uri="s3://models/day0-results/org/m/r1/cpu-bf16/runs/x/", files=[],
        reason="cannot reach the S3 endpoint", kept_at="2026-01-01T12:00:00+00:00",
        flow_run_id=flow_run_id, prefect_api_url=api,
        published_uri="s3://models/day0-results/org/m/r1/cpu-bf16/runs/x/",
        final_state=outbox.VerdictState(completed=True, name="PASS", message="PASS: 12 gates"))


def test_a_drained_run_shows_its_verdict(prefect_server):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Failed, Running

    from day0.orchestration.outbox import show_verdict
    from flows.results import read_report, result_storage

    @flow(persist_result=True, result_serializer="json", result_storage=result_storage())
    def unpublished():
        return Failed(name="NOT PUBLISHED", message="PASS, not published: store down",
                      data={"verdict": "PASS"})

    state = unpublished(return_state=True)
    run_id = str(state.state_details.flow_run_id)
    assert show_verdict(_manifest(run_id, prefect_server))
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        assert (run.state.type.value, run.state.name) == ("COMPLETED", "PASS")
        assert run.state.message == ("PASS: 12 gates; published late to "
                                     "s3://models/day0-results/org/m/r1/cpu-bf16/runs/x/")
        assert read_report(run) == {"verdict": "PASS"}  # `day0 validate --deployment` reads it
        # set once: a run no longer "NOT PUBLISHED" is left as it is
        assert show_verdict(_manifest(run_id, prefect_server))
        assert client.read_flow_run(run_id).state.name == "PASS"
        running = client.create_flow_run(unpublished, state=Running())
        assert not show_verdict(_manifest(str(running.id), prefect_server))  # ends later
    assert show_verdict(_manifest(str(uuid.uuid4()), prefect_server))  # no such run: done
    started = time.monotonic()
    assert not show_verdict(_manifest(run_id, "http://127.0.0.1:9/api"))  # kept for later
    assert time.monotonic() - started < 5
