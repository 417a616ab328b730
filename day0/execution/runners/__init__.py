"""Stage runners: one contract (StageSpec in, StageOutcome out, never raise for the stage).

``run_on_target(spec, target, log)`` picks the runner the target names:

* ``process``    - day0.execution.stage.run_stage: a subprocess on this machine (the embedded default);
* ``docker``     - day0.execution.runners.docker: a container of ``target.container.image`` via the Docker SDK;
* ``deployment`` - day0.execution.runners.deployment: the day0-stage flow deployed on a Prefect work pool
  (Docker or Kubernetes), possibly on another machine, via ``run_deployment``.

``target_slot(target)`` bounds how many stages of this process use one target at once
(``target.concurrency``): a device is not shared by two stages unless the profile says so.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from day0.execution.budget import derive, params_of, shape_of, with_budget
from day0.execution.stage import StageOutcome, StageSpec, run_stage
from day0.execution.targets import Target

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
    """Run spec with the target's runner inside one of its concurrency slots, within the stage's
    budget (the target's limits, else derived from the model's size: day0.execution.budget)."""
    budget = derive(spec.stage, target, params_of(spec.facts),
                    reference=spec.inputs.reference, shape=shape_of(spec.facts),
                    stage_config=spec.config)
    with target_slot(target):
        if target.runner == "process":
            return run_stage(spec, budget=budget, log=log)
        # these runners read the limits from the target: hand them the budget's figures
        limited = with_budget(target, budget)
        if target.runner == "docker":
            from day0.execution.runners.docker import run_in_container
            outcome = run_in_container(spec, limited, log=log)
        else:
            from day0.execution.runners.deployment import run_on_deployment
            outcome = run_on_deployment(spec, limited, log=log)
        return outcome.model_copy(update={"budget": budget})


__all__ = ["run_on_target", "target_slot"]
