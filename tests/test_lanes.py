"""tests/lanes.py: the waiting lane holds every Docker module and never an engine or timing test,
and the two sessions of `make test` together run every test once."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT
from tests.lanes import WAITING


def collected(*args: str) -> tuple[int, set[str]]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, {line for line in done.stdout.splitlines() if "::" in line}


def test_every_waiting_module_exists():
    assert all((ROOT / prefix).exists() for prefix in WAITING), WAITING


def test_the_two_sessions_split_the_suite_and_docker_tests_stay_in_the_lane():
    code_all, everything = collected()
    code_lane, lane = collected("-m", "waits")
    code_main, main = collected("-m", "not waits")
    assert (code_all, code_lane, code_main) == (0, 0, 0)
    assert lane and main and not lane & main and lane | main == everything
    # containers are counted by label: only one session may start them
    code, docker_outside = collected("-m", "docker and not waits")
    assert code == 5 and not docker_outside
    code, late = collected("-m", "waits and (engine or timing)")
    assert code == 5 and not late
