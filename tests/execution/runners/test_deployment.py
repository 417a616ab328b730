"""The deployment runner against real child flow runs: deployments served by a Prefect runner in a
subprocess on the session's test server. Completed -> the child's outcome; Failed/Crashed ->
failure "crash" naming the deployment and flow run; past the deadline -> "timeout" and the child
is cancelled; never an exception."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from prefect import flow

from day0.execution.contract import StageInputs
from day0.execution.runners import run_on_target
from day0.execution.runners.deployment import (GRACE_ENV, RESULTS_ENV, run_on_deployment,
                                               stage_results_base)
from day0.execution.stage import StageSpec, run_stage
from day0.execution.targets import Target
from tests.conftest import MODELS, ROOT
from tests.procs import stop_group

pytestmark = pytest.mark.integration
DEPLOYMENT = "unit"


# --- child flows, served by _serve() in a subprocess (entrypoints in this file) ---------------

@flow(name="unit-raises")
def raises(spec: dict, result_uri: str | None = None):
    raise RuntimeError("the stage flow itself broke")


@flow(name="unit-dies")
def dies(spec: dict, result_uri: str | None = None):
    os.kill(os.getpid(), signal.SIGKILL)  # the job's process vanishes: the runner reports Crashed


@flow(name="unit-hangs")
def hangs(spec: dict, result_uri: str | None = None):
    time.sleep(300)


@flow(name="unit-silent")
def silent(spec: dict, result_uri: str | None = None):
    return {"ok": True}  # completes without writing the outcome


def _serve() -> None:
    from prefect import serve

    from flows.stage import day0_stage

    serve(*(f.to_deployment(name=DEPLOYMENT) for f in (raises, dies, hangs, silent, day0_stage)),
          limit=8)


@pytest.fixture(scope="module")
def served(prefect_server, tmp_path_factory):
    """The five deployments, served until the module ends; yields nothing but their presence."""
    from prefect.client.orchestration import get_client

    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    log = tmp_path_factory.mktemp("served") / "serve.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", "from tests.execution.runners.test_deployment import "
                                 "_serve; _serve()"], cwd=str(ROOT), env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    with get_client(sync_client=True) as client:
        while True:
            try:
                client.read_deployment_by_name(f"day0-stage/{DEPLOYMENT}")
                break
            except Exception:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "deployments never appeared: " + log.read_text()[-3000:]
                time.sleep(0.5)
    yield log
    stop_group(proc)


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "stage-results"))
    monkeypatch.setenv(GRACE_ENV, "60")
    return tmp_path / "stage-results"


def _target(flow_name: str, **extra) -> Target:
    return Target(name="cpu-bf16-remote", device="cpu", dtype="bfloat16", runner="deployment",
                  deployment=f"{flow_name}/{DEPLOYMENT}", **extra)


def _spec(target: Target, stage: str = "analysis") -> StageSpec:
    return StageSpec(stage=stage, inputs=StageInputs(source=str(MODELS / "tiny-llama"), target=target))


def _state_of(flow_run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id).state


def _run_id(outcome) -> str:
    assert outcome.ran_in.startswith("deployment:"), outcome.ran_in
    return outcome.ran_in.rsplit(":", 1)[1]


def _settled(result: dict) -> dict:
    """A result without what the moment decides: wall time, memory free when it ran."""
    reference = {k: v for k, v in result["reference"].items() if k != "available_gib"}
    return {**{k: v for k, v in result.items() if k != "wall_s"}, "reference": reference}


def test_completed_child_returns_its_outcome(served, results_dir):
    target = _target("day0-stage")
    lines: list[str] = []
    outcome = run_on_target(_spec(target), target, log=lines.append)  # the dispatch the task uses
    local = run_stage(_spec(target), timeout_s=600)
    assert outcome.ok, outcome.error
    assert outcome.metrics == local.metrics
    assert _settled(outcome.result) == _settled(local.result)
    assert _state_of(_run_id(outcome)).is_completed()
    assert any("day0-stage/unit" in line and "Completed" in line for line in lines), lines
    assert not any(results_dir.rglob("*.json")), "the exchanged outcome file is cleaned up"


def test_failed_stage_is_a_failed_outcome_of_a_completed_run(served, results_dir):
    target = _target("day0-stage")
    outcome = run_on_deployment(_spec(target, stage="no-such-stage"), target)
    assert not outcome.ok and outcome.failure == "input" and "no-such-stage" in outcome.error
    state = _state_of(_run_id(outcome))
    assert state.is_completed() and "failed (input)" in state.message


@pytest.mark.parametrize("flow_name, state_name", [("unit-raises", "Failed"), ("unit-dies", "Crashed")])
def test_failed_or_crashed_child_is_a_crash_with_its_reason(served, results_dir, flow_name, state_name):
    target = _target(flow_name)
    started = time.monotonic()
    outcome = run_on_deployment(_spec(target), target)
    assert time.monotonic() - started < 120
    assert not outcome.ok and outcome.failure == "crash"
    run_id = _run_id(outcome)
    assert f"deployment {flow_name}/{DEPLOYMENT}" in outcome.error and run_id in outcome.error
    assert f"ended {state_name}" in outcome.error, outcome.error
    assert _state_of(run_id).name == state_name
    if flow_name == "unit-raises":
        assert "the stage flow itself broke" in outcome.error
    assert "\n" not in outcome.error


def test_unwritable_result_location_fails_the_child_run(served, tmp_path, monkeypatch):
    monkeypatch.setenv(RESULTS_ENV, "/proc/day0-not-writable")
    target = _target("day0-stage")
    outcome = run_on_deployment(_spec(target), target)
    assert not outcome.ok and outcome.failure == "crash" and "ended Failed" in outcome.error


def test_completed_without_outcome_is_a_crash(served, results_dir):
    target = _target("unit-silent")
    outcome = run_on_deployment(_spec(target), target)
    assert not outcome.ok and outcome.failure == "crash"
    assert "wrote no outcome" in outcome.error and str(results_dir) in outcome.error


def test_timeout_cancels_the_child(served, results_dir, monkeypatch):
    monkeypatch.setenv(GRACE_ENV, "0")
    target = _target("unit-hangs", timeout_s=8)
    started = time.monotonic()
    outcome = run_on_deployment(_spec(target), target)
    assert 8 <= time.monotonic() - started < 30
    assert not outcome.ok and outcome.failure == "timeout"
    run_id = _run_id(outcome)
    assert "did not finish within 8 s" in outcome.error and run_id in outcome.error
    deadline = time.monotonic() + 60
    while not (state := _state_of(run_id)).is_cancelled():
        assert time.monotonic() < deadline, f"child run not cancelled: {state}"
        time.sleep(1)


def test_unknown_deployment_is_a_config_failure(prefect_server, results_dir):
    target = Target(name="t", device="cpu", dtype="bfloat16", runner="deployment",
                    deployment="day0-stage/does-not-exist")
    outcome = run_on_deployment(_spec(target), target)
    assert not outcome.ok and outcome.failure == "config"
    assert "day0-stage/does-not-exist" in outcome.error and "prefect deploy" in outcome.error


def test_local_source_needs_a_shared_results_location(monkeypatch):
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    target = _target("day0-stage")
    outcome = run_on_deployment(_spec(target), target)  # nothing is submitted: no API needed
    assert not outcome.ok and outcome.failure == "config" and RESULTS_ENV in outcome.error
    s3_spec = StageSpec(stage="analysis", inputs=StageInputs(source="s3://models/acme/llm", target=target))
    assert stage_results_base(s3_spec) == "s3://models/day0-results/_stages"
    monkeypatch.setenv(RESULTS_ENV, "s3://shared/day0/")
    assert stage_results_base(s3_spec) == "s3://shared/day0"

