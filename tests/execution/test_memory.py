"""Peak memory is the process's own, not inherited from a large parent across exec."""

from __future__ import annotations

import os
import subprocess
import sys

from day0.execution import memory

CHILD = "from day0.execution import memory; print(memory.peak_rss_bytes())"


def test_child_peak_is_its_own_not_the_parents():
    ballast = bytearray(600 * 2**20)          # touched pages: the parent's peak is >= 600 MiB
    ballast[::4096] = b"\x01" * len(ballast[::4096])
    assert memory.peak_rss_bytes() >= 600 * 2**20
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True).stdout
    assert 0 < int(out) < 300 * 2**20          # a bare interpreter: tens of MiB
    del ballast


def test_rss_of_a_live_and_a_gone_process():
    assert memory.rss_bytes(os.getpid()) > 0
    assert memory.rss_bytes(2**22 + 7) == 0    # above pid_max's default: no such process
