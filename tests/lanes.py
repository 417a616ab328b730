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
  vLLM process), and no test marked timing is: those wait, in the other session, until this lane
  has ended (tests/setup_gate.py) and the CPUs are quiet;
- a module is kept whole (its module fixtures are set up once)."""

from __future__ import annotations

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
