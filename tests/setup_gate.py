"""`make test` builds the Docker images, the engine venv and Chromium while the tests that need
none of them run: this plugin (loaded by tests/conftest.py) puts the modules holding a test
marked docker, engine or browser after every other module (a module with a test marked timing
after those), and holds each such test until the set-up has finished. Nothing is skipped: a
failed set-up fails those tests with its log. Tests marked timing (they judge wall-clock figures)
wait too, so no build runs beside them, and then wait until the CPUs are quiet (tests/quiet.py),
after the waiting lane (tests/lanes.py) has ended. Engine tests run beside the lane: they judge
what the engine answers, not how fast, and vLLM for CPU binds its own thread (measured: waiting
for the lane left the machine a quarter idle for the length of the engine tests).

The Makefile names the set-up's status file in DAY0_SETUP_STATUS (its exit code, written when it
ends) and its log in DAY0_SETUP_LOG, and the waiting lane's in DAY0_LANE_STATUS; without them (a
plain pytest run) nothing waits and the order is unchanged.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.lanes import use_every_core_once_the_lane_ended, written_status
from tests.quiet import wait_until_quiet

NEEDS_SETUP = ("docker", "engine", "browser", "timing")
AFTER_THE_LANE = ("timing",)  # judged on wall-clock figures: never beside the lane
WAIT_S = float(os.environ.get("DAY0_SETUP_WAIT_S", "2700"))  # the slowest set-up, on a cold CI


def needs_setup(item) -> bool:
    return any(item.get_closest_marker(name) for name in NEEDS_SETUP)


def order(items: list) -> list:
    """Modules with a test that needs the set-up go last, those with a timing test after them
    (they wait for the lane to end), each kept whole and in its order (a split module would set
    its module fixtures up twice). Of the former, those of a package with a timing module come
    right before it: a package fixture (tests/engines' vLLM) then lives on into its timing
    tests instead of being stopped for another package's module and started again (~30 s)."""
    late = {item.module.__name__ for item in items if needs_setup(item)}
    last = {item.module.__name__ for item in items
            if any(item.get_closest_marker(name) for name in AFTER_THE_LANE)}
    timed_packages = {name.rpartition(".")[0] for name in last}

    def rank(item) -> int:
        name = item.module.__name__
        if name in last:
            return 3
        if name in late:
            return 2 if name.rpartition(".")[0] in timed_packages else 1
        return 0

    return sorted(items, key=rank)  # stable: the order within each rank is kept


@pytest.hookimpl(trylast=True)  # after the packages' own hooks have added their markers
def pytest_collection_modifyitems(config, items):
    if os.environ.get("DAY0_SETUP_STATUS"):
        items[:] = order(items)


_finished: dict[str, int] = {}


def _wait_for_status(env_name: str) -> int | None:
    """The exit code in the status file that env_name names, once written; None when no file
    is named or none was written within WAIT_S."""
    if not os.environ.get(env_name):
        return None
    deadline = time.monotonic() + WAIT_S
    while (code := written_status(env_name)) is None:
        if time.monotonic() > deadline:
            return None
        time.sleep(2)
    return code


def wait_for_setup() -> None:
    """Return once the set-up succeeded; fail (with its log's tail) when it failed or never
    ended within WAIT_S."""
    if not os.environ.get("DAY0_SETUP_STATUS"):
        return
    if "code" not in _finished:
        code = _wait_for_status("DAY0_SETUP_STATUS")
        if code is None:
            pytest.fail(f"`make setup` had not finished after {WAIT_S:.0f} s "
                        f"(log: {os.environ.get('DAY0_SETUP_LOG')})", pytrace=False)
        _finished["code"] = code
    if _finished["code"] != 0:
        log = Path(os.environ.get("DAY0_SETUP_LOG", ""))
        tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        pytest.fail(f"`make setup` (Docker images, engine venv, Chromium) failed with exit "
                    f"{_finished['code']}:\n{tail}", pytrace=False)


def wait_for_lane() -> None:
    """Return once the waiting lane's session has ended (whatever its result: the Makefile judges
    it), or after WAIT_S: a timing test is then judged beside it, and says so."""
    if not os.environ.get("DAY0_LANE_STATUS") or "lane" in _finished:
        return
    if _wait_for_status("DAY0_LANE_STATUS") is None:
        print(f"\nwarning: the waiting lane had not ended after {WAIT_S:.0f} s", file=sys.stderr)
    _finished["lane"] = 1


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures (an engine, a container) start
def pytest_runtest_setup(item):
    if needs_setup(item):
        wait_for_setup()
    if any(item.get_closest_marker(name) for name in AFTER_THE_LANE):
        wait_for_lane()
    use_every_core_once_the_lane_ended(item)  # tests/lanes.py: one thread while the lane runs
    if item.get_closest_marker("timing"):
        wait_until_quiet()
