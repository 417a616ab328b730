"""Progress end to end: a stage child's progress lines reach the runner's log callback, the
Prefect task turns them into a progress artifact of the flow run, a silent stage gets heartbeats."""

from __future__ import annotations

import pytest

from day0.execution import progress
from day0 import stages
from day0.execution.contract import StageInputs
from day0.execution.stage import StageSpec, run_stage
from day0.execution.targets import resolve_target
from tests.conftest import MODELS, ROOT

LOCATOR = "tests.stages.ticker"


@pytest.fixture()
def ticker(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the child imports tests.stages.ticker
    stages.register("ticker", LOCATOR)
    yield
    stages.unregister("ticker")


def spec(**config) -> StageSpec:
    return StageSpec(stage="ticker", locator=LOCATOR, config=config, inputs=StageInputs(
        source=str(MODELS / "tiny-llama"), target=resolve_target("cpu-bf16")))


@pytest.mark.slow
def test_silent_stage_gets_one_heartbeat_and_progress_stays_out_of_the_tail(ticker):
    said: list[str] = []
    outcome = run_stage(spec(steps=3, silent_s=12), log=said.append, timeout_s=120,
                        memory_limit_gib=4)
    assert outcome.ok, outcome.error
    found = [p for p in map(progress.parse, said) if p]
    # in the same second: the first and the finished one (rate limit; the last never dropped)
    assert [(p.what, p.done, p.total) for p in found] == [("steps", 1, 3), ("steps", 3, 3)]
    beats = [line for line in said if line.startswith("[heartbeat]")]
    assert len(beats) == 1, said  # 12 s of silence: one line at 10 s, never more than one per 10 s
    assert "stage ticker still running" in beats[0] and "GiB" in beats[0]
    assert "last progress: steps 3/3" in beats[0]
    assert not any(line.startswith(progress.PREFIX) for line in outcome.log_tail)


@pytest.mark.integration
def test_stage_task_publishes_a_progress_artifact_per_running_stage(ticker, prefect_server):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from tasks.stages import run_stage_task

    @flow(name="progress-test", persist_result=False)
    def one_stage():
        s = spec(steps=5, step_s=0.3)
        return run_stage_task(s.stage, s.locator, s.config, s.inputs, use_cache=False)

    state = one_stage(return_state=True)
    assert state.result().ok
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    found = [a for a in found if a.type == "progress"]
    assert [a.key for a in found] == ["day0-progress-ticker"]
    assert float(found[0].data) == 100.0 and found[0].description.startswith("ticker: done (")
    assert found[0].task_run_id is not None
