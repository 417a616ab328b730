"""Resident memory of processes, read from /proc (Linux), with a portable fallback.

The peak is ``VmHWM`` of the process's own address space. ``getrusage().ru_maxrss`` is not used
on Linux: it survives ``execve``, so a stage started from a large parent (a test session, a flow
worker) would report the parent's peak as its own.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path


def _status_field(pid: int | str, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_bytes(pid: int) -> int:
    """Current resident memory of pid; 0 when it cannot be read (gone, or not Linux)."""
    return _status_field(pid, "VmRSS") or 0


def peak_rss_bytes() -> int:
    """Peak resident memory of this process since it started (or last exec'd)."""
    peak = _status_field("self", "VmHWM")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024   # bytes on macOS, KiB elsewhere


def available_bytes() -> float | None:
    """Memory a new allocation can get now: MemAvailable, or this cgroup's limit when lower
    (Linux); None where unknown."""
    available = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = float(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            available = min(available or float("inf"), float(limit))
    except OSError:
        pass
    return available


_earlier_peak = 0  # the highest VmHWM before the last reset (stage_peak_rss_bytes keeps it)


def stage_peak_rss_bytes() -> int:
    """Peak resident memory of this process over its whole life (or since forget_peak_rss),
    whatever resets measured peaks of phases in between."""
    return max(_earlier_peak, peak_rss_bytes())


def forget_peak_rss() -> bool:
    """A forked child's fresh start: neither the parent's peak nor its earlier ones count."""
    global _earlier_peak
    _earlier_peak = 0
    return _clear_peak()


def reset_peak_rss() -> bool:
    """Start a new peak (Linux: VmHWM is reset to the current RSS); False where unsupported.
    The process's own peak is kept (stage_peak_rss_bytes)."""
    global _earlier_peak
    _earlier_peak = max(_earlier_peak, peak_rss_bytes())
    return _clear_peak()


def _clear_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in process group pgid (a stage and the children it
    started); without /proc, the leader's alone."""
    proc = Path("/proc")
    if not proc.is_dir():
        return rss_bytes(pgid)
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
            if int(raw[raw.rindex(")") + 2:].split()[2]) == pgid:  # field 5: pgrp
                total += rss_bytes(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return total
