"""`day0 serve` registers the validate deployment; runs by `day0 validate --deployment` and by
`prefect deployment run` both execute and complete against the session's Prefect server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import MODELS
from tests.procs import stop_group

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(prefect_server, tmp_path_factory):
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "day0.cli", "serve", "--name", "day0-test",
                                 "--target", "cpu-bf16"], stdout=fh, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + 120
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            try:
                client.read_deployment_by_name("validate/day0-test")
                break
            except Exception:
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(1)
        else:
            pytest.fail("deployment never appeared: " + log.read_text()[-3000:])
    yield env
    stop_group(proc)


def test_validate_on_deployment_reaches_verdict(served):
    proc = subprocess.run([sys.executable, "-m", "day0.cli", "validate", str(MODELS / "tiny-llama"),
                           "--target", "cpu-bf16", "--deployment", "validate/day0-test"],
                          capture_output=True, text=True, timeout=900, env=served)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verdict: PASS" in proc.stdout
    # at once: where to watch it; while waiting: the run's state and its stages' progress
    said = proc.stderr.splitlines()
    url = [i for i, line in enumerate(said) if re.match(
        r"flow run \S+: http://127\.0\.0\.1:\d+/runs/flow-run/[0-9a-f-]{36}$", line)]
    assert url, proc.stderr[-3000:]
    assert any(re.match(r"  \[ *\d+ s\] (Pending|Running|Scheduled)", line)
               for line in said[url[0]:]), said


def test_prefect_deployment_run_by_hand(served):
    from prefect.client.orchestration import get_client

    proc = subprocess.run([str(Path(sys.executable).parent / "prefect"), "deployment", "run", "validate/day0-test",
                           "-p", f"source={MODELS / 'tiny-llama'}", "-p", "target=cpu-bf16"],
                          capture_output=True, text=True, timeout=120, env=served,
                          cwd=str(MODELS.parents[2]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = next(line.split()[-1] for line in proc.stdout.splitlines() if "UUID" in line)
    deadline = time.monotonic() + 600
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            state = client.read_flow_run(run_id).state
            if state and state.is_final():
                break
            time.sleep(0.5)  # a local server: polling is cheap, waiting is not
    assert state.is_completed(), state
    assert state.result()["verdict"] == "PASS"


def test_prefect_yaml_deploys_to_a_process_pool(prefect_server, tmp_path):
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "DAY0_HOME": str(MODELS.parents[2])}
    prefect = str(Path(sys.executable).parent / "prefect")
    root = MODELS.parents[2]
    subprocess.run([prefect, "work-pool", "create", "day0-process", "--type", "process"],
                   capture_output=True, text=True, timeout=120, env=env, cwd=root)
    proc = subprocess.run([prefect, "--no-prompt", "deploy", "--prefect-file", "deploy/prefect.yaml",
                           "--name", "day0"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("validate/day0")
    assert deployment.work_pool_name == "day0-process"
    assert deployment.entrypoint == "flows/validate.py:validate"
    assert deployment.parameters == {"target": "cpu-bf16"}
