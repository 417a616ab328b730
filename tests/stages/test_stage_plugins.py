"""A stage added from outside day0 (an installed package's entry point, or the registry API)
runs in the validate flow, is gated and reported; nothing under day0/, flows/ or tasks/ names it.

The plug-in lives in a temporary folder with a ``.dist-info`` declaring it in the ``day0.stages``
entry-point group, exactly as ``pip install vendor-stage`` would; PYTHONPATH carries it to the
stage's child process.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest
import yaml

from day0.execution import cache
from day0 import stages
from day0.execution.contract import StageInputs
from day0.errors import ConfigError, InputError
from day0.execution.stage import StageSpec
from day0.execution.targets import resolve_target
from tests.conftest import MODELS, ROOT

# the plug-in is one folder: its face (__init__.py), its core, metrics.yaml and budget.yaml
STAGE_CODE = '''
"""Echo stage (test plug-in): reports the model's parameter count that analysis found, times a
factor. What it proves: that a plug-in reads a required stage's result. Needs: analysis."""
from day0.execution.contract import Option, Stage, import_core


class Echo(Stage):
    requires = ("analysis",)
    options = (Option("echo_factor", setting="factor", metavar="X",
                      help="multiply the parameter count by X"),)

    def core(self):
        return import_core(__name__)

    def markdown(self, evidence, gates):
        return f"## Echo\\n\\n- parameters seen by the echo stage: {evidence['params']:g}\\n"
'''

CORE_CODE = '''
"""The echo stage's core."""
from pydantic import BaseModel, ConfigDict, Field

from day0.execution.contract import StageInputs, StageResult


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    factor: float = Field(1.0, description="Multiplies the parameter count.")


class Result(StageResult):
    params: float
    source: str

    def metrics(self):
        return {"echo.params": self.params}


def run(config: Config, inputs: StageInputs) -> Result:
    total = inputs.upstream["analysis"]["params"]["total"]
    return Result(params=total * config.factor, source=inputs.source)
'''


@pytest.fixture()
def echo_stage(tmp_path, monkeypatch):
    """An installed-looking package `day0_echo_stage` with entry point `echo` in day0.stages."""
    site = tmp_path / "site"
    pkg = site / "day0_echo_stage"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STAGE_CODE)
    (pkg / "core.py").write_text(CORE_CODE)
    (pkg / "metrics.yaml").write_text(yaml.safe_dump({"metrics": {"echo.params": {
        "description": "Parameters analysis counted, times factor.", "unit": "count"}}}))
    dist = site / "day0_echo_stage-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: day0-echo-stage\nVersion: 1.0\n")
    (pkg / "budget.yaml").write_text(yaml.safe_dump({  # its own budget, in its folder
        "description": "reads analysis' result; holds no model.", "fixed_gib": 2,
        "fixed_s": 120}))
    (dist / "entry_points.txt").write_text("[day0.stages]\necho = day0_echo_stage\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", f"{site}:{ROOT}")
    importlib.invalidate_caches()
    yield site
    sys.modules.pop("day0_echo_stage", None)


def gates_file(tmp_path, threshold: float) -> str:
    path = tmp_path / f"gates-{threshold:g}.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "gates": [
        {"id": "echo-params", "metric": "echo.params", "op": ">=", "threshold": threshold},
        {"id": "plan-fits", "metric": "analysis.plan_fits", "op": "==", "threshold": 1}]}))
    return str(path)


def test_entry_point_stage_is_registered_planned_and_its_metrics_gateable(echo_stage, tmp_path):
    assert "echo" in stages.names() and stages.get("echo").requires == ("analysis",)
    assert stages.plan(["echo"], "torch") == [["analysis"], ["echo"]]
    assert stages.plan(None, "torch")[0] == ["analysis"]  # echo joins every torch validation
    from day0.verdict.gates import load_gates, metric_catalog

    assert metric_catalog()["echo.params"]["stage"] == "echo"
    assert [g.metric for g in load_gates(gates_file(tmp_path, 1)).gates][0] == "echo.params"


def test_day0_stages_lists_a_plugin_stage_with_what_it_proves_needs_and_runs_on(echo_stage):
    """`day0 stages` (a fresh process: the entry point comes through PYTHONPATH)."""
    import os
    import subprocess

    listed = subprocess.run([sys.executable, "-m", "day0.cli", "stages", "--json"],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert listed.returncode == 0, listed.stderr[-2000:]
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert list(rows)[:len(stages.builtin())] == list(stages.builtin())
    assert rows["echo"] == {
        "name": "echo", "proves": "Echo stage (test plug-in): reports the model's parameter "
                                  "count that analysis found, times a factor.",
        "runs_on": ["torch"], "requires": ["analysis"], "after": [], "uses_endpoint": False,
        "exclusive": False, "options": ["--echo-factor"], "locator": "day0_echo_stage"}
    assert rows["performance"]["exclusive"] and rows["smoke"]["runs_on"] == ["engine"]
    table = subprocess.run([sys.executable, "-m", "day0.cli", "stages"], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ)).stdout.splitlines()
    assert table[0].split() == ["STAGE", "RUNS", "ON", "NEEDS", "FLAGS", "OPTIONS", "PROVES"]
    echo = next(line for line in table if line.startswith("echo "))
    assert echo.split()[:5] == ["echo", "torch", "analysis", "-", "--echo-factor"]


def test_registry_api_and_its_errors(echo_stage):
    stages.register("echo_again", "day0_echo_stage")
    try:
        assert stages.plan(["echo_again"], "torch") == [["analysis"], ["echo_again"]]
    finally:
        stages.unregister("echo_again")
    with pytest.raises(InputError, match="did you mean 'echo'"):
        stages.get("ech")
    with pytest.raises(ConfigError, match="does not support 'server' targets"):
        stages.plan(["echo"], "server")
    with pytest.raises(InputError, match="not installed"):  # checked when it registers
        stages.register("missing_stage", "no_such_vendor.stage")
    assert "missing_stage" not in stages.names()


@pytest.mark.integration
def test_plugin_stage_runs_in_the_flow_is_gated_and_reported(echo_stage, prefect_server, tmp_path,
                                                            capsys):
    """The plug-in folder is the whole change: its metrics, budget and CLI option come with it
    (acceptance: adding a stage is one new folder plus its gates)."""
    from flows.results import report_of
    from flows.validate import validate as flow

    def validate(**kwargs):  # FAIL and ERROR runs end Failed: read the report off the state
        return report_of(flow(**kwargs, return_state=True))

    source = str(MODELS / "tiny-llama")
    out = tmp_path / "out"
    report = validate(source=source, target="cpu-bf16", stages=["echo"], out=str(out),
                      gates=gates_file(tmp_path, 1), options={"echo_factor": "2"})
    analysis_total = report["model"]["params"]["total"]
    assert report["verdict"] == "PASS", report["gates"]
    assert report["metrics"]["echo.params"] == 2.0 * analysis_total
    assert report["evidence"]["echo"]["params"] == 2.0 * analysis_total
    assert set(report["stages"]) == {"analysis", "echo"}  # scan and alignment not selected
    # its budget from its own folder's budget.yaml (fixed_gib 2, fixed_s 120; no copies)
    assert report["stages"]["echo"]["budget"]["memory_gib"] == 2.0
    assert report["stages"]["echo"]["budget"]["timeout_s"] == 120.0
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["gates"][0]["id"] == "echo-params" and on_disk["gates"][0]["passed"]
    assert f"parameters seen by the echo stage: {2.0 * analysis_total:g}" in (out / "report.md").read_text()
    # the same stage's metric can fail its gate, through its own option on the command line
    from day0.cli import main

    capsys.readouterr()
    assert main(["validate", source, "--stages", "echo", "--echo-factor", "2", "--json",
                 "--gates", gates_file(tmp_path, 1e12)]) == 1
    failed = json.loads(capsys.readouterr().out)
    assert failed["verdict"] == "FAIL" and not failed["gates"][0]["passed"]
    assert failed["metrics"]["echo.params"] == 2.0 * analysis_total
    assert failed["stages"]["echo"]["cached"]  # same weights, config and code: reused
    # a bad config of the plug-in is checked against its Config before anything runs: exit 2,
    # with did-you-mean (the plug-in declares no config_module: its core's Config)
    settings = tmp_path / "echo.yaml"
    settings.write_text(yaml.safe_dump({"echo": {"facter": 2.0}}))
    assert main(["validate", source, "--stages", "echo", "--config", str(settings),
                 "--gates", gates_file(tmp_path, 1)]) == 2
    assert "echo.facter: unknown field 'facter' (fix: did you mean 'factor')" in \
        capsys.readouterr().err


def test_cache_keys_hold_only_what_a_stage_reads(echo_stage):
    """scan does not read analysis: a re-run of analysis never invalidates it; echo reads it."""
    inputs = StageInputs(source=str(MODELS / "tiny-llama"), target=resolve_target("cpu-bf16"))
    scan = StageSpec(stage="scan", locator="day0.stages.scan", inputs=inputs)
    assert cache.stage_key(scan, "w") == cache.stage_key(
        scan.model_copy(update={"facts": {"params": {"total": 5}}}), "w")  # budgets only
    echo = StageSpec(stage="echo", locator="day0_echo_stage", inputs=inputs.model_copy(
        update={"upstream": {"analysis": {"params": {"total": 5}, "wall_s": 0.1}}}))
    same = echo.model_copy(update={"inputs": inputs.model_copy(
        update={"upstream": {"analysis": {"params": {"total": 5}, "wall_s": 9.9}}})})
    # keyed by the required stage's key, not its result (whose timing changes every run)
    assert cache.stage_key(echo, "w", {"analysis": "k1"}) == cache.stage_key(same, "w", {"analysis": "k1"})
    assert cache.stage_key(echo, "w", {"analysis": "k1"}) != cache.stage_key(echo, "w", {"analysis": "k2"})
    # the plug-in's own code is in its key
    before = cache.stage_key(echo, "w", {"analysis": "k1"})
    (echo_stage / "day0_echo_stage" / "__init__.py").write_text(STAGE_CODE + "\n# changed\n")
    assert cache.stage_key(echo, "w", {"analysis": "k1"}) != before


def test_every_stage_folder_says_what_it_proves_and_needs():
    for name in stages.builtin():
        doc = importlib.import_module(f"day0.stages.{name}").__doc__ or ""
        assert "What it proves" in doc and "needs" in doc, name
    assert not (ROOT / "day0" / "stages" / "echo").exists()
    text = textwrap.dedent(STAGE_CODE)
    assert "What it proves" in text
