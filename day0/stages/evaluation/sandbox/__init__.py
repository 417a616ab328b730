"""Model-written programs run where they can do no harm: a benchmark's code (HumanEval, MBPP) is
executed to score it, and what a model writes is untrusted.

Two backends, one contract (`run(programs, limits) -> [Outcome]`, in order):

* ``docker`` (day0.stages.evaluation.sandbox.container): one container of the project's image
  for the batch, no network, a read-only root, a tmpfs scratch, uid 65534, no capability,
  no-new-privileges, memory and pids limits, an empty environment;
* ``process`` (day0.stages.evaluation.sandbox.namespace): `unshare --net --mount --pid` (a user
  namespace too when not root), every mount remounted read-only, tmpfs over /tmp, /var/tmp and
  /dev/shm, each program as `nobody` when root.

Either way each program runs alone in an empty scratch folder with a wall-clock limit (its whole
process group is killed), an address-space, CPU-time, file-size and open-files limit, and no
inherited environment. ``auto`` takes Docker when its daemon answers and the image is present,
else the process backend; when neither can isolate, nothing runs: a ConfigError names the fix.
"""

from __future__ import annotations

from typing import Literal

from day0.errors import ConfigError
from day0.stages.evaluation.sandbox import container, namespace
from day0.stages.evaluation.sandbox.contract import Limits, Outcome, SandboxError

Backend = Literal["auto", "docker", "process"]
__all__ = ["Backend", "Limits", "Outcome", "SandboxError", "run"]


def run(programs: list[str], limits: Limits | None = None, backend: Backend = "auto",
        image: str | None = None) -> list[Outcome]:
    """Each program's outcome, in order (see the module docstring)."""
    limits = limits or Limits()
    if not programs:
        return []
    if backend == "docker" or (backend == "auto" and container.available(image)):
        return container.run(programs, limits, image)
    problem = namespace.unavailable()
    if problem:
        raise ConfigError(f"no sandbox for model-written code: {problem}",
                          field="evaluation.sandbox", fix="build the project's image (`make "
                          "images`) with a Docker daemon running, or allow `unshare` (root, or "
                          "unprivileged user namespaces)")
    return namespace.run(programs, limits)
