"""Fault: never return, like a collective that waits forever for a peer or a deadlocked driver."""

import time


def apply(model) -> None:
    while True:
        time.sleep(1)
