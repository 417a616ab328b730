"""The stage contract (day0.execution.contract.Stage) and the registry (day0.stages) as the flow's
process uses them: planning a validation and concluding its verdict read every stage's face,
never a stage's core; a stage that breaks the contract is refused when it is defined or loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from day0 import stages
from day0.execution.contract import Stage
from day0.errors import InputError

READ_EVERY_HOOK = """
import sys
from day0 import stages

for name in stages.names():
    stage = stages.get(name)
    stage.requires, stage.after, stage.target_kinds, stage.uses_endpoint, stage.options
    stage.exclusive, stage.metrics_file, stage.budget_file, stage.describe(), stage.builtin
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
    assert stage.load().run.__module__ == "day0.stages.evaluation.core"
    assert stage.load().Config.model_config["extra"] == "forbid"


def test_every_builtin_stage_is_a_folder_with_a_face_a_core_metrics_and_a_budget():
    """One packaging: the folder's __init__.py is the face (a Stage subclass), core.py the core;
    the folder is the whole registration (nothing else in day0 names it)."""
    root = Path(stages.__file__).parent
    assert sorted(stages.builtin()) == sorted(p.name for p in root.iterdir()
                                             if (p / "__init__.py").is_file())
    for name in stages.builtin():
        stage = stages.get(name)
        assert isinstance(stage, Stage) and stage.builtin and stage.folder == root / name
        assert (root / name / "core.py").is_file() and stage.load().__name__.endswith(".core")
        assert stage.metrics_file.is_file() and stage.budget_file.is_file()
        assert stage.summary.endswith((".", "?")), name


def test_a_stage_that_breaks_the_contract_is_refused_where_it_is_defined():
    with pytest.raises(TypeError, match="target_kinds must name some of torch, engine"):
        type("Bad", (Stage,), {"__doc__": "Proves x.", "target_kinds": ("tpu",),
                               "core": lambda self: None})
    with pytest.raises(TypeError, match="requires must be a tuple of stage names"):
        type("Bad", (Stage,), {"__doc__": "Proves x.", "requires": "analysis",
                               "core": lambda self: None})
    with pytest.raises(TypeError, match="options must be day0.execution.contract.Option"):
        type("Bad", (Stage,), {"__doc__": "Proves x.", "options": ("--text",),
                               "core": lambda self: None})


def test_a_stage_without_its_core_or_with_a_core_lacking_run_is_refused_by_name(tmp_path,
                                                                              monkeypatch):
    (tmp_path / "coreless_stage.py").write_text(
        '"""Proves nothing."""\nfrom day0.execution.contract import Stage\n\n\n'
        'class Coreless(Stage):\n    pass\n')
    (tmp_path / "runless_stage.py").write_text(
        '"""Proves nothing."""\nimport sys\n\nfrom pydantic import BaseModel, ConfigDict\n\n'
        'from day0.execution.contract import Stage, StageResult\n\n\n'
        'class Config(BaseModel):\n    model_config = ConfigDict(extra="forbid")\n\n\n'
        'class Result(StageResult):\n    pass\n\n\n'
        'class Runless(Stage):\n    def core(self):\n        return sys.modules[__name__]\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(InputError, match="coreless.*abstract method core"):
        stages.register("coreless", "coreless_stage")
    stages.register("runless", "runless_stage")
    try:
        with pytest.raises(InputError, match=r"core runless_stage lacks run\(config, inputs\)"):
            stages.get("runless").load()
    finally:
        stages.unregister("runless")
