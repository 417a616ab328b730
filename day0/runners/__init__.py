"""Stage runners: one contract (StageSpec in, StageOutcome out, never raise for the stage).

``run_on_target(spec, target, log)`` picks the runner the target names:

* ``process``    - day0.stage.run_stage: a subprocess on this machine (the embedded default);
* ``docker``     - day0.runners.docker: a container of ``target.container.image`` via the Docker SDK;
* ``deployment`` - day0.runners.deployment: the day0-stage flow deployed on a Prefect work pool
  (Docker or Kubernetes), possibly on another machine, via ``run_deployment``.

``target_slot(target)`` bounds how many stages of this process use one target at once
(``target.concurrency``): a device is not shared by two stages unless the profile says so.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from day0.stage import StageOutcome, StageSpec, run_stage
from day0.targets import Target

_slots: dict[tuple, threading.BoundedSemaphore] = {}
_slots_lock = threading.Lock()


@contextmanager
def target_slot(target: Target) -> Iterator[None]:
    """Hold one of the target's `concurrency` slots while a stage runs on it."""
    key = (target.name, target.device, target.runner, target.concurrency)
    with _slots_lock:
        slot = _slots.setdefault(key, threading.BoundedSemaphore(target.concurrency))
    with slot:
        yield


def run_on_target(spec: StageSpec, target: Target,
                  log: Callable[[str], None] | None = None) -> StageOutcome:
    """Run spec with the target's runner inside one of its concurrency slots."""
    with target_slot(target):
        if target.runner == "docker":
            from day0.runners.docker import run_in_container
            return run_in_container(spec, target, log=log)
        if target.runner == "deployment":
            from day0.runners.deployment import run_on_deployment
            return run_on_deployment(spec, target, log=log)
        return run_stage(spec, timeout_s=target.timeout_s,
                         memory_limit_gib=target.memory_limit_gib, log=log)


__all__ = ["run_on_target", "target_slot"]
