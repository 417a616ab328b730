"""Waiting for Prefect flow runs in tests, always bounded."""

from __future__ import annotations

import time

import pytest


def wait_final(run_id, timeout_s: float = 900):
    """The flow run once its state is final; the test fails after timeout_s."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            run = client.read_flow_run(run_id)
            if run.state and run.state.is_final():
                return run
            time.sleep(0.5)  # a local server: polling is cheap, waiting is not
    pytest.fail(f"flow run {run_id} not final after {timeout_s} s")
