"""The stage registry (day0.stages) as the flow's process uses it: planning a validation and
concluding its verdict read every stage's light hooks, never a stage's core."""

from __future__ import annotations

import subprocess
import sys

from day0 import stages

READ_EVERY_HOOK = """
import sys
from day0 import stages

for name in stages.names():
    stage = stages.get(name)
    stage.module, stage.requires, stage.after, stage.target_kinds, stage.uses_endpoint
    stage.exclusive, stage.metrics_file
stages.plan(None, "torch"), stages.plan(None, "engine")
print(sorted(m for m in ("torch", "transformers", "lm_eval") if m in sys.modules))
"""


def test_reading_every_stage_imports_no_core():
    """Checking that a lazy stage has Config, Result and run must not import its core (torch,
    lm-eval): the flow's process asked ~60 times per validation and paid torch's import."""
    done = subprocess.run([sys.executable, "-c", READ_EVERY_HOOK], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_a_lazy_stage_still_provides_its_core():
    stage = stages.get("evaluation")
    assert stage.module.run.__module__ == "day0.stages.evaluation.core"
    assert stage.module.Config.model_config["extra"] == "forbid"
