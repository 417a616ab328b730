"""Tests marked timing judge wall-clock figures: a baseline measured while another test's leftover
process (a container being torn down, an engine still exiting) burns a core reads slow, and a
later, truly slower run then looks faster than it. Before such a test, wait (bounded) until this
machine's CPUs are quiet; when they never are, say which processes kept them busy."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

BUSY_SHARE = 0.3  # of all cores, over one second
QUIET_SECONDS = 3  # in a row
WAIT_S = float(os.environ.get("DAY0_QUIET_WAIT_S", "90"))


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs; steal (other tenants) counts as neither."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


def _process_times() -> dict[int, tuple[str, int]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.find("(") + 1:stat.rfind(")")]
            rest = stat[stat.rfind(")") + 2:].split()
            found[int(entry.name)] = (name, int(rest[11]) + int(rest[12]))  # utime + stime
    return found


def busiest(seconds: float = 1.0, top: int = 5) -> list[str]:
    before = _process_times()
    time.sleep(seconds)
    after = _process_times()
    used = sorted(((ticks - before[pid][1], pid, name) for pid, (name, ticks) in after.items()
                   if pid in before), reverse=True)
    hz = os.sysconf("SC_CLK_TCK")
    return [f"{name} (pid {pid}) {100 * d / hz / seconds:.0f}%" for d, pid, name in used[:top] if d]


def wait_until_quiet(wait_s: float = WAIT_S) -> float:
    """Seconds waited; after wait_s, a warning naming the busiest processes, and go on."""
    started = time.monotonic()
    quiet = 0
    busy, total = _cpu_times()
    while quiet < QUIET_SECONDS:
        if time.monotonic() - started > wait_s:
            print(f"\nwarning: CPUs still busy after {wait_s:.0f} s; busiest: "
                  f"{', '.join(busiest()) or 'none seen'}", file=sys.stderr)
            break
        time.sleep(1)
        busy2, total2 = _cpu_times()
        share = (busy2 - busy) / max(1, total2 - total)
        busy, total = busy2, total2
        quiet = quiet + 1 if share < BUSY_SHARE else 0
    return time.monotonic() - started
