"""A target's concurrency bounds how many stages use it at once."""

from __future__ import annotations

import threading
import time

import pytest

from day0.execution.runners import target_slot
from day0.execution.targets import Target


def peak_parallel(target: Target, workers: int = 4) -> int:
    inside, peak, lock = 0, 0, threading.Lock()

    def stage():
        nonlocal inside, peak
        with target_slot(target):
            with lock:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.1)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=stage) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return peak


@pytest.mark.parametrize("concurrency", [1, 2])
def test_no_more_stages_than_the_concurrency_share_a_target(concurrency):
    target = Target(name=f"slots-{concurrency}", device="cuda", dtype="bfloat16",
                    concurrency=concurrency)
    assert peak_parallel(target) == concurrency


def test_different_targets_do_not_wait_for_each_other():
    a = Target(name="slots-a", device="cuda:0", dtype="bfloat16")
    b = Target(name="slots-b", device="cuda:1", dtype="bfloat16")
    got_b, got_a_again = threading.Event(), threading.Event()

    def take(target, event):
        with target_slot(target):
            event.set()

    with target_slot(a):  # a is busy; b is free and a second stage on a waits
        threading.Thread(target=take, args=(b, got_b), daemon=True).start()
        waiter = threading.Thread(target=take, args=(a, got_a_again), daemon=True)
        waiter.start()
        assert got_b.wait(5)
        assert not got_a_again.wait(0.2)
    assert got_a_again.wait(5)
