"""The rules of a validation request live in day0.request_rules (the CLI only parses and
dispatches)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from day0 import request_rules as request
from day0.errors import ConfigError, InputError
from tests.conftest import MODELS

LLAMA = MODELS / "tiny-llama"


def test_build_checks_and_normalises(tmp_path, monkeypatch):
    monkeypatch.chdir(LLAMA.parent)
    text = tmp_path / "eval.txt"
    text.write_text("some text")
    req = request.build("tiny-llama", options={"text": str(text), "duration": None},
                        out="out", revision="v1")
    assert req.source == str(LLAMA.resolve()) and req.target == "cpu-bf16"
    assert req.out == str((LLAMA.parent / "out").resolve())
    # a stage's option travels checked (the file made absolute); the flow sets its setting
    assert req.options == {"text": str(text.resolve())} and req.stage_configs is None
    from day0 import stages

    assert stages.apply_options({}, req.options) == {"alignment": {"text_file": str(text.resolve())}}
    params = req.as_parameters()
    # the target always travels: a deployment's own default must not replace it
    assert params["target"] == "cpu-bf16" and params["revision"] == "v1"
    assert request.build("s3://models/acme/m").source == "s3://models/acme/m"


@pytest.mark.parametrize("kwargs,error,needle", [
    ({"source": "nowhere/at/all"}, InputError, "no such file or folder"),
    ({"source": "s3://"}, InputError, "s3://"),
    ({"config": {"alignmnet": {}}}, ConfigError, "did you mean 'alignment'"),
    ({"config": {"alignment": 3}}, ConfigError, "must map setting names"),
    ({"config": ["alignment"]}, InputError, "must map stage names"),
    ({"options": {"text": "missing.txt"}}, ConfigError, "no such file: missing.txt"),
    ({"options": {"duration": "0s"}}, ConfigError, "bad --duration '0s': it must be positive"),
    ({"options": {"duraton": "1m"}}, ConfigError, "did you mean 'duration'"),
    ({"options": {"promote_baseline": "yes"}}, ConfigError, "is a switch"),
    ({"target_file": "target.yaml", "deployment": "day0"}, ConfigError, "--target NAME"),
])
def test_build_refuses_before_any_run(tmp_path, kwargs, error, needle):
    kwargs = dict(kwargs)
    if "config" in kwargs:
        path = tmp_path / "stages.yaml"
        path.write_text(yaml.safe_dump(kwargs["config"]))
        kwargs["config"] = str(path)
    if "target_file" in kwargs:
        path = tmp_path / "target.yaml"
        path.write_text(yaml.safe_dump({"name": "x", "device": "cpu", "dtype": "bfloat16"}))
        kwargs["target_file"] = str(path)
    with pytest.raises(error, match=needle):
        request.build(kwargs.pop("source", str(LLAMA)), **kwargs)


def _report(verdict: str, **failures):
    from day0.execution.stage import StageOutcome
    from day0.verdict.report import EXIT_CODES, exit_status_of

    stages = {name: SimpleNamespace(failure=f, error=f"stage {name}: {f} problem")
              for name, f in failures.items()}
    outcomes = {name: StageOutcome(stage=name, ok=f is None, failure=f)
                for name, f in failures.items()}
    code = exit_status_of(verdict, outcomes)
    assert code == (2 if {"input", "config"} & set(failures.values()) else EXIT_CODES[verdict])
    return SimpleNamespace(stages=stages, exit_code=code)


def test_exit_status_of_a_report():
    """The report records the code the CLI ends with (they always agree, issue 27)."""
    assert request.exit_status(_report("PASS", analysis=None)) == (0, None)
    assert request.exit_status(_report("ERROR", scan="crash")) == (3, None)
    # a stage that refused its input or config: the same exit 2 as the CLI's own refusals
    assert request.exit_status(_report("ERROR", analysis="input")) == (
        2, "stage analysis: input problem")
    assert request.exit_status(_report("FAIL", scan="config"))[0] == 2


def test_stage_inputs_for_one_stage():
    inputs = request.stage_inputs(str(LLAMA), target="cpu-bf16")
    assert inputs.source == str(LLAMA) and inputs.target.name == "cpu-bf16"
    with pytest.raises(InputError):
        request.stage_inputs(str(Path("nowhere")))
