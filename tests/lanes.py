"""`make test` runs the suite as two pytest sessions side by side: this plugin (loaded by
tests/conftest.py) marks `waits` the modules that spend most of their wall time waiting, and the
Makefile runs `-m waits` in a second session beside `-m "not waits"`.

Why two sessions and not xdist: measured on the 2-core machine (a serial `make test` with a
sampler of /proc/stat beside it), the suite is 60 % CPU-bound. Two xdist workers split it blindly,
both lanes then run torch work at once with two OpenMP threads each on two cores, and the run was
slower than the serial one. The modules below were at most half busy on the machine in that run:
deliberate outages (a store down 20 s and 60 s, a Prefect server down 60 s), processes killed and
restarted, hangs waited out to their timeout, containers started. They run in their own session
(their own Prefect harness, cache and stage host, conftest.py) with one OpenMP thread, while the
CPU-bound rest runs in this one.

What may run in the waiting lane, and what must not:
- every module with a Docker test is here (they count containers by label: the two sessions never
  both start containers), no module of the vLLM engine package is (engine tests scan /proc for any
  vLLM process; they run in the other session, beside this lane), and no test marked timing is:
  those wait, in the other session, until this lane has ended (tests/setup_gate.py) and the CPUs
  are quiet;
- a few CPU-bound modules are here too (listed last), to even out the two sessions' lengths;
- a module is kept whole (its module fixtures are set up once).

While the lane runs, this session's torch work uses one OpenMP thread too (OMP_NUM_THREADS=1 for
its children and stage hosts, torch.set_num_threads(1) here), then every core once the lane has
ended (before the next module). Measured on the 2-core machine (tiny-llama, 20 bf16 forwards of
32x256 tokens): two threads beside one busy process take 8.7 s, one thread 3.8 s, two threads
alone 3.1 s. A parallel region waits for its slowest thread, and with three runnable threads on
two cores one of them is always descheduled: in the run before this change the first session's
real-model and evaluation-budget tests ran 3.2x slower than alone.

The Makefile names the lane's status file in DAY0_LANE_STATUS (this session only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# module paths (prefixes) of the waiting lane; with their share of the machine busy in that run
WAITING = (
    "tests/faults/",                          # store down 20 s + 60 s; Prefect down 60 s (0.26, 0.35)
    "tests/receiver/",                        # kill -9 under load, restarts, webhooks (0.16-0.70)
    "tests/stack/",                           # `day0 stack up/down/restart` as processes (0.29, 0.47)
    "tests/store/",                           # store outages waited out (0.10-0.19)
    "tests/orchestration/test_server.py",     # a kept server's idle stop (0.40)
    "tests/orchestration/test_outage.py",
    "tests/execution/runners/",               # containers, a hang to its timeout (0.15-0.48)
    "tests/execution/test_progress_stage.py",  # a silent stage's heartbeat (0.15)
    "tests/test_compose.py",                  # docker compose up, restart (0.50)
    "tests/test_workpools.py",                # a Docker worker's containers (0.73)
    "tests/stages/evaluation/sandbox/test_container.py",  # programs in a container
    # CPU-bound, here so that both sessions end together: the other session runs the engine
    # tests after its own (measured on 2 cores, 2026-12-07: this lane 1,800 s, the other's tests
    # up to its timing modules 1,831 s, then those 336 s alone)
    "tests/test_flow.py",                     # whole validations on real Prefect (163 s)
    "tests/stages/evaluation/test_budget_fit.py",  # three evaluations under limits (96 s)
)
MARKER = "waits"
NEVER = ("engine", "timing")  # see the docstring


def in_waiting_lane(nodeid: str) -> bool:
    return nodeid.startswith(WAITING)


@pytest.hookimpl(tryfirst=True)  # before tests/setup_gate.py orders what needs the set-up last
def pytest_collection_modifyitems(config, items):
    for item in items:
        if in_waiting_lane(item.nodeid):
            if any(item.get_closest_marker(name) for name in NEVER):
                raise pytest.UsageError(f"{item.nodeid} is marked {'/'.join(NEVER)}: it cannot "
                                        "run in the waiting lane (tests/lanes.py WAITING)")
            item.add_marker(MARKER)


THREADS_ENV = "OMP_NUM_THREADS"
LANE_STATUS_ENV = "DAY0_LANE_STATUS"
_shared: dict = {}  # "before": THREADS_ENV's value to restore (None: unset), while sharing


def written_status(env_name: str) -> int | None:
    """The exit code in the status file that env_name names once the Makefile wrote it; None
    while it is not written (or no file is named)."""
    status = os.environ.get(env_name)
    text = Path(status).read_text().strip() if status and Path(status).is_file() else ""
    return int(text) if text else None


def _lane_running() -> bool:
    return bool(os.environ.get(LANE_STATUS_ENV)) and written_status(LANE_STATUS_ENV) is None


def pytest_configure(config):
    if _lane_running():
        _shared["before"] = os.environ.get(THREADS_ENV)
        os.environ[THREADS_ENV] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)


def use_every_core_once_the_lane_ended(item) -> None:
    """Called before each test (tests/setup_gate.py): once the lane has ended, this session's
    children, stage hosts (keyed by their OpenMP settings: a new one starts) and torch get every
    core again, at the first test of a module (a module's fixtures and tests compare numbers
    computed alike; the engine a package keeps serves with the thread vLLM binds itself)."""
    module, _shared["module"] = _shared.get("module"), item.module.__name__
    if "before" not in _shared or module == item.module.__name__ or _lane_running():
        return
    before = _shared.pop("before")
    if before is None:
        os.environ.pop(THREADS_ENV, None)
    else:
        os.environ[THREADS_ENV] = before
    if "torch" in sys.modules:  # what torch picks by itself in this environment
        default = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
            capture_output=True, text=True, timeout=120)
        sys.modules["torch"].set_num_threads(int(default.stdout.strip() or os.cpu_count() or 1))
    from day0.execution import stagehost

    stagehost.prewarm()  # the host for the restored environment, ready by the next stage
