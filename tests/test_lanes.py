"""tests/lanes.py: the waiting lane holds every Docker module and never an engine or timing test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.lanes import WAITING


def collected(*args: str) -> tuple[int, set[str]]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, {line for line in done.stdout.splitlines() if "::" in line}


def test_every_waiting_module_exists():
    assert all((ROOT / prefix).exists() for prefix in WAITING), WAITING


@pytest.mark.slow  # a collection of the whole suite (~8 s on 2 cores): not in test-fast
def test_the_lane_holds_every_docker_test_and_collects():
    """`-m waits` and `-m "not waits"` split the suite by construction; what can go wrong is a
    Docker module left in the other session, a module marked `waits` by hand outside the lane's
    list, or an engine or timing test put in the lane (a usage error at collection, so the lane's
    session would fail). One collection answers all three: everything marked waits or docker is
    in the lane's modules."""
    code, lane_or_docker = collected("-m", "waits or docker")
    assert code == 0 and lane_or_docker
    outside = {nodeid for nodeid in lane_or_docker if not nodeid.startswith(WAITING)}
    assert not outside, sorted(outside)[:10]
    # the collection did see the Docker tests
    assert any(nodeid.startswith("tests/test_compose.py::") for nodeid in lane_or_docker)


WHILE_THE_LANE_RUNS = """
import os, pathlib, torch

def test_while_the_lane_runs():
    assert os.environ["OMP_NUM_THREADS"] == "1" and torch.get_num_threads() == 1
    pathlib.Path(os.environ["DAY0_LANE_STATUS"]).write_text("0\\n")  # the lane ends

def test_the_rest_of_the_module_keeps_its_thread():  # its numbers are computed alike
    assert os.environ["OMP_NUM_THREADS"] == "1" and torch.get_num_threads() == 1
"""
ONCE_IT_HAS_ENDED = """
import os, torch

def test_the_next_module_gets_every_core():
    assert "OMP_NUM_THREADS" not in os.environ
    assert torch.get_num_threads() == int(os.environ["THREADS_ALONE"])
"""


def test_the_other_session_uses_one_thread_while_the_lane_runs_then_every_core(tmp_path):
    """The session beside the lane (the Makefile gives it DAY0_LANE_STATUS) starts with one
    OpenMP thread, here and for its children, and gets torch's own default back at the first
    module after the lane's status file is written."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    alone = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, env=env, timeout=120)
    (tmp_path / "test_beside_a.py").write_text(WHILE_THE_LANE_RUNS)
    (tmp_path / "test_beside_b.py").write_text(ONCE_IT_HAS_ENDED)
    env.update(DAY0_LANE_STATUS=str(tmp_path / "lane.status"), THREADS_ALONE=alone.stdout.strip(),
               DAY0_STAGE_HOST="0")  # no warm host for the restored environment: nothing forks
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "tests.lanes", "-p", "tests.setup_gate",
                           str(tmp_path / "test_beside_a.py"), str(tmp_path / "test_beside_b.py")],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout
