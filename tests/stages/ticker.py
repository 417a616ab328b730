"""Ticker stage (test plug-in): counts `steps` with progress lines, then stays silent `silent_s`.
What it proves: nothing about a model; it shows progress and heartbeats travel from a stage to
its runner and the Prefect task. Needs: nothing (no weights, no device)."""

from __future__ import annotations

import time
import sys

from pydantic import BaseModel, ConfigDict, Field

from day0.execution import progress
from day0.execution.contract import Stage, StageInputs, StageResult



class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = Field(4, ge=0, description="Progress steps reported.")
    step_s: float = Field(0.0, ge=0, description="Seconds per step.")
    silent_s: float = Field(0.0, ge=0, description="Seconds of silence after the steps.")


class Result(StageResult):
    steps: int

    def metrics(self):
        return {}


def run(config: Config, inputs: StageInputs) -> Result:
    progress.plan({"steps": 1})
    for i in range(config.steps):
        time.sleep(config.step_s)
        progress.update("steps", i + 1, config.steps, detail=f"step {i + 1}")
    time.sleep(config.silent_s)
    return Result(steps=config.steps)


class Ticker(Stage):
    budget_name = "ticker_budget.yaml"  # a module, not a folder: its own name for it

    def core(self):
        return sys.modules[__name__]  # face and core in one module: nothing heavy to defer
