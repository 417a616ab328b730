"""tests/lanes.py: the waiting lane holds every Docker module and never an engine or timing test."""

from __future__ import annotations

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


@pytest.mark.slow  # two collections of the whole suite (~8 s each on 2 cores): not in test-fast
def test_the_lane_holds_every_docker_test_and_collects():
    """`-m waits` and `-m "not waits"` split the suite by construction; what can go wrong is a
    Docker module left in the other session, or an engine or timing test put in the lane (a
    usage error at collection, so the lane's session would fail)."""
    code, lane = collected("-m", "waits")
    assert code == 0 and lane
    assert all(nodeid.startswith(WAITING) for nodeid in lane)
    code, docker_outside = collected("-m", "docker and not waits")
    assert code == 5 and not docker_outside
