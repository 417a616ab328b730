"""Fault: kill the whole process (SIGKILL) when applied, like a driver crash or the OOM killer.

Only ever load this in a stage subprocess: it takes down whatever process imports and applies it.
"""

import os
import signal


def apply(model) -> None:
    os.kill(os.getpid(), signal.SIGKILL)
