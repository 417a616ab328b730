"""The stage contract: every stage is ``run(config, inputs) -> Result`` over pydantic models.

A stage module (day0.stages.analysis, day0.stages.scan, day0.stages.alignment) exposes:

* ``Config``  - pydantic, ``extra="forbid"``: the stage's own settings;
* ``Result``  - pydantic, subclass of :class:`StageResult`: JSON-serialisable evidence;
* ``run(config: Config, inputs: StageInputs) -> Result``: pure core, no Prefect inside.

``Result.metrics()`` returns the flat ``{metric_name: value}`` that gates read; the names it may
produce are declared in the stage folder's ``metrics.yaml`` and a test checks they agree.
The runner (day0.stage) executes a stage in a subprocess: spec JSON in, result JSON out.
"""

from __future__ import annotations

import importlib
import time
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from day0.engines.settings import Endpoint
from day0.memory import peak_rss_bytes, reset_peak_rss
from day0.targets import REFERENCE, Target


class StageInputs(BaseModel):
    """What every stage receives besides its own Config."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="Checkpoint folder or config.json path.")
    target: Target = Field(description="The target profile under test.")
    reference: Target = Field(REFERENCE, description="The reference, normally cpu/float32.")
    upstream: dict[str, dict] = Field(default_factory=dict, description=(
        "Results of earlier stages of the same run, by stage name, as JSON."))
    trust_remote_code: bool = Field(False, description="Allow the model's own code (auto_map).")
    revision: str | None = Field(None, description=(
        "The release's revision when one is named (keys stored reference scores of this "
        "model/revision); None for an anonymous run."))
    endpoint: Endpoint | None = Field(None, description=(
        "Engine targets: where the engine under test answers (attached, or launched by the "
        "flow for the run's engine stages); None for torch targets."))


class Row(BaseModel):
    """A row of a result table; NaN/inf are findings, so JSON keeps them ("NaN", "Infinity")
    instead of null."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class StageResult(BaseModel):
    """Base of every stage Result."""

    model_config = ConfigDict(extra="forbid")

    checkpoint_problems: list[str] = Field(default_factory=list, description=(
        "Findings that the checkpoint itself is broken (not the target): the verdict is then "
        "BROKEN whatever the gates say."))

    def metrics(self) -> dict[str, float | None]:
        """Flat metric name -> value; None when the stage could not compute it."""
        raise NotImplementedError


class Laps:
    """A stage's phase timings for its Result: ``lap(name)`` records the seconds since the
    previous lap (or since construction), and the phase's peak resident memory in MiB (Linux;
    elsewhere the peak since the process started)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.peak_rss_mib: dict[str, float] = {}
        self._clock = time.monotonic()
        reset_peak_rss()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = round(now - self._clock, 3)
        self.peak_rss_mib[name] = round(peak_rss_bytes() / 2**20, 1)
        reset_peak_rss()
        self._clock = now


def lazy_core(package: str, names: tuple[str, ...]) -> Callable[[str], object]:
    """A stage package's module ``__getattr__`` that imports ``<package>.core`` (torch, lm-eval)
    only when one of names is asked for: the flow reads the package's light hooks alone."""

    def __getattr__(name: str):
        if name not in names:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        return getattr(importlib.import_module(f"{package}.core"), name)

    __getattr__.provides = names  # what the core provides, known without importing it
    return __getattr__
