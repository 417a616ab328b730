"""Stage budgets: derived from the model's size by default, explicit target limits win, and a
stage over its budget is killed with a reason that names the budget (verdict ERROR)."""

from __future__ import annotations

import pytest
import yaml

from day0.execution import budget
from day0.execution.contract import StageInputs
from day0.execution.stage import StageSpec, run_stage
from day0.stages import builtin, get
from day0.execution.targets import resolve_target
from tests.conftest import MODELS, PLUGINS

SMOLLM2 = 134_515_008  # SmolLM2-135M's params.total


def cpu_bf16(**update):
    return resolve_target("cpu-bf16").model_copy(update=update)


def own_factors() -> dict:
    """A worker's factors file as data: the shipped globals and every stage's own factors."""
    data = yaml.safe_load(budget.BUDGETS_FILE.read_text())
    data["stages"] = {name: yaml.safe_load(get(name).budget_file.read_text()) for name in builtin()}
    return data


def tiny_factors(tmp_path, fixed_gib=0.01, fixed_s=600):
    """budgets.yaml with allowances far below what a Python+torch process needs."""
    data = own_factors()
    for stage in data["stages"].values():
        stage.update(fixed_gib=fixed_gib, fixed_s=fixed_s, activation_factor=1.0)
    path = tmp_path / "budgets.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_stage_declares_its_factors_in_its_folder():
    assert budget.load_factors().stages == {}  # the shipped file names no stage
    for name in builtin():
        assert get(name).budget_file == get(name).folder / "budget.yaml"
        assert budget.stage_factors(name).fixed_s > 0


def test_a_factors_file_overrides_only_the_stages_it_names(tmp_path, monkeypatch):
    data = yaml.safe_load(budget.BUDGETS_FILE.read_text())
    data["stages"] = {"scan": {"fixed_gib": 1.5, "fixed_s": 60}}
    path = tmp_path / "worker-budgets.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv(budget.BUDGETS_ENV, str(path))
    assert budget.derive("scan", cpu_bf16(), None).memory_gib == 1.5
    own = budget.stage_factors("alignment", budget.load_factors(None))
    assert budget.derive("alignment", cpu_bf16(), None).memory_gib == own.fixed_gib


def test_a_stage_without_budget_factors_is_a_config_error_naming_its_file(tmp_path):
    from day0.verdict import pipeline
    from day0 import stages
    from day0.errors import ConfigError

    (tmp_path / "budgetless_stage.py").write_text(
        '"""A stage that forgot its budget."""\nimport sys\n\nfrom day0.execution.contract import Stage\n'
        "\n\nclass Budgetless(Stage):\n    def core(self):\n        return sys.modules[__name__]\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    stages.register("budgetless", "budgetless_stage")
    stages.register("budgetless_too", "budgetless_stage")
    try:
        with pytest.raises(ConfigError) as raised:
            budget.derive("budgetless", cpu_bf16(), None)
        assert "stage 'budgetless' declares no resource budget" in str(raised.value)
        assert str(tmp_path / "budget.yaml") in str(raised.value)
        with pytest.raises(ConfigError, match="2 problems"):  # every planned stage at once
            pipeline.check_budgets([["analysis"], ["budgetless", "scan"], ["budgetless_too"]])
        pipeline.check_budgets([["analysis"], ["scan", "alignment"]])
        # run directly (no flow checked it first): a failed outcome naming the file, no raise
        outcome = run_stage(StageSpec(stage="budgetless", locator="budgetless_stage", inputs=(
            StageInputs(source=str(MODELS / "tiny-llama"), target=cpu_bf16()))))
        assert not outcome.ok and outcome.failure == "config" and outcome.exit_code == 2
        assert "declares no resource budget" in outcome.error
    finally:
        stages.unregister("budgetless")
        stages.unregister("budgetless_too")
        sys.path.remove(str(tmp_path))
        sys.modules.pop("budgetless_stage", None)


def test_derived_default_follows_size_and_dtypes():
    factors = budget.load_factors()
    f = budget.stage_factors("alignment")
    got = budget.derive("alignment", cpu_bf16(), SMOLLM2)
    # reference float32 (4 B) + control and target bfloat16 (2 B each)
    expected = SMOLLM2 * (4 + 2 + 2) * f.activation_factor / 2**30 + f.fixed_gib
    assert got.memory_gib == pytest.approx(expected, abs=0.01)
    assert got.timeout_s == pytest.approx(f.fixed_s + f.seconds_per_billion_params * SMOLLM2 / 1e9, abs=1)
    assert not got.memory_explicit and not got.timeout_explicit
    assert got.memory_basis == "derived from 134.5M parameters"
    # bigger models, wider dtypes: more of both
    fp32 = budget.derive("alignment", cpu_bf16(dtype="float32"), SMOLLM2)
    assert fp32.memory_gib > got.memory_gib
    assert budget.derive("alignment", cpu_bf16(), 10 * SMOLLM2).timeout_s > got.timeout_s
    # nothing counted yet (the analysis stage itself): the fixed allowance
    first = budget.derive("analysis", cpu_bf16(), None)
    assert first.memory_gib == budget.stage_factors("analysis").fixed_gib and first.params is None
    assert factors.bytes_per_dtype["float32"] == 4


def test_huge_model_is_capped_at_the_host():
    got = budget.derive("alignment", cpu_bf16(), 671_000_000_000)
    assert got.memory_gib <= budget.host_memory_gib() * budget.load_factors().host_memory_fraction
    assert "capped at 80% of this host's memory" in got.memory_basis


def test_explicit_target_limits_win(tmp_path):
    tfile = tmp_path / "t.yaml"
    tfile.write_text(yaml.safe_dump({"name": "npu-x", "device": "cpu", "dtype": "bfloat16",
                                     "memory_limit_gib": 64, "timeout_s": 7200}))
    target = resolve_target(file=str(tfile))
    got = budget.derive("alignment", target, SMOLLM2)
    assert (got.memory_gib, got.timeout_s) == (64, 7200)
    assert got.memory_explicit and got.timeout_explicit
    assert got.memory_basis == "memory_limit_gib of target npu-x"
    only_time = budget.derive("alignment", cpu_bf16(timeout_s=60), SMOLLM2)
    assert only_time.timeout_s == 60 and not only_time.memory_explicit
    assert resolve_target("cpu-bf16").timeout_s is None  # built-ins leave both to the budget


def test_exceeding_a_derived_budget_is_an_oom_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv(budget.BUDGETS_ENV, str(tiny_factors(tmp_path)))
    spec = StageSpec(stage="alignment", inputs=StageInputs(
        source=str(MODELS / "tiny-llama"), target=cpu_bf16()),
        facts={"params": {"total": 1_345_000}})
    outcome = run_stage(spec)
    assert not outcome.ok and outcome.failure == "oom"
    assert outcome.error.startswith("stage alignment exceeded its memory budget of ")
    assert ("GiB derived from 1.3M parameters; set memory_limit_gib in the target file to "
            "raise it") in outcome.error
    assert outcome.budget.params == 1_345_000 and outcome.seconds < 60


def test_exceeding_a_derived_time_budget_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv(budget.BUDGETS_ENV, str(tiny_factors(tmp_path, fixed_gib=8, fixed_s=0.5)))
    # the hang plugin never returns: the stage ends only by its budget
    spec = StageSpec(stage="alignment", inputs=StageInputs(
        source=str(MODELS / "tiny-llama"), target=cpu_bf16(plugins=[str(PLUGINS / "hang.py")])))
    outcome = run_stage(spec)
    assert outcome.failure == "timeout"
    assert "exceeded its time budget of 0.5 s" in outcome.error
    assert "set timeout_s in the target file to raise it" in outcome.error


@pytest.mark.integration
def test_over_budget_stage_gives_error_verdict_with_the_reason(prefect_server, tmp_path,
                                                                monkeypatch):
    """In the flow the budget comes from analysis' parameter count; over it = ERROR, and the
    report shows every stage's budget."""
    from flows.results import report_of
    from flows.validate import validate

    factors = yaml.safe_load(budget.BUDGETS_FILE.read_text())
    factors["stages"] = {"alignment": {**yaml.safe_load(get("alignment").budget_file.read_text()),
                                       "fixed_gib": 0.01, "activation_factor": 1.0}}
    path = tmp_path / "budgets.yaml"
    path.write_text(yaml.safe_dump(factors))
    monkeypatch.setenv(budget.BUDGETS_ENV, str(path))
    tfile = tmp_path / "t.yaml"
    tfile.write_text(yaml.safe_dump({"name": "cpu-bf16-budget", "device": "cpu",
                                     "dtype": "bfloat16"}))
    # the stages whose budgets it reads (analysis runs before them)
    report = report_of(validate(source=str(MODELS / "tiny-llama"), target_file=str(tfile),
                                use_cache=False, stages=["scan", "alignment"], return_state=True))
    assert report["verdict"] == "ERROR"
    alignment = report["stages"]["alignment"]
    assert alignment["failure"] == "oom"
    params = report["model"]["params"]["total"]
    assert f"derived from {budget.format_params(params)} parameters" in alignment["error"]
    assert any("exceeded its memory budget" in e for e in report["errors"])
    assert alignment["budget"]["memory_gib"] < 0.1
    assert report["stages"]["analysis"]["budget"]["params"] is None
    assert report["stages"]["scan"]["budget"]["params"] == params


def test_alignment_budget_covers_the_context_of_a_real_model():
    """SmolLM2-135M at default settings peaked at 5.3 GiB in its alignment stage
    (`/usr/bin/time -v day0 validate SMOLLM2 --target-file T` with memory_limit_gib 20); a budget
    from the parameter count alone (4.5 GiB) killed that correct stack."""
    shape = budget.ModelShape(num_layers=30, hidden_size=576, vocab_size=49152, max_context=8192)
    got = budget.derive("alignment", cpu_bf16(), SMOLLM2, shape=shape)
    assert got.memory_gib >= 1.5 * 5.3 and "for its context" in got.memory_basis
    shorter = budget.derive("alignment", cpu_bf16(), SMOLLM2, shape=shape.model_copy(
        update={"max_context": 2048}))
    assert got.memory_gib > shorter.memory_gib > budget.derive("alignment", cpu_bf16(), SMOLLM2).memory_gib
    # the scan and analysis do not hold the context
    assert budget.derive("scan", cpu_bf16(), SMOLLM2, shape=shape).memory_gib == \
        budget.derive("scan", cpu_bf16(), SMOLLM2).memory_gib
    facts = {"num_layers": 30, "hidden_size": 576, "vocab_size": 49152, "max_context": 8192,
             "params": {"total": SMOLLM2}}
    assert budget.shape_of(facts) == shape and budget.shape_of({}) is None
    assert budget.params_of(facts) == SMOLLM2


def test_stage_config_context_settings_move_the_budget():
    shape = budget.ModelShape(num_layers=30, hidden_size=576, vocab_size=49152, max_context=8192)
    default = budget.derive("alignment", cpu_bf16(), SMOLLM2, shape=shape)
    longer = budget.derive("alignment", cpu_bf16(), SMOLLM2, shape=shape,
                           stage_config={"seq_len": 32768})
    smaller_chunks = budget.derive("alignment", cpu_bf16(), SMOLLM2, shape=shape,
                                   stage_config={"chunk_tokens": 256})
    assert longer.memory_gib > default.memory_gib > smaller_chunks.memory_gib


def test_configured_work_moves_the_time_budget():
    """Stage.work: a config that asks more than the default work gets the time for it (its
    budget.yaml's factors per item and per generated token, per billion parameters)."""
    from day0.stages.evaluation.config import Config

    default = budget.derive("evaluation", cpu_bf16(), SMOLLM2)
    factors = budget.stage_factors("evaluation")
    multiple_choice = budget.derive("evaluation", cpu_bf16(), SMOLLM2, stage_config={
        "tasks": ["arc_easy", "piqa", "hellaswag"], "limit": 500})
    per_item = factors.seconds_per_billion_params_per_item * SMOLLM2 / 1e9
    assert multiple_choice.timeout_s == pytest.approx(default.timeout_s + 1500 * per_item, abs=0.1)
    assert "1500 items" in multiple_choice.timeout_basis
    quick = get("evaluation").work(Config(suite="quick").model_dump())
    # 8 standard tasks of 26 items; gsm8k_cot and mbpp generate up to 256 tokens, humaneval 1024
    assert (quick.items, quick.generated_tokens) == (8 * 26, 26 * (256 + 1024 + 256))
    full = budget.derive("evaluation", cpu_bf16(), SMOLLM2, stage_config={"suite": "full"})
    assert full.timeout_s > 10 * default.timeout_s  # hours of benchmarks on a CPU
    # the soak runs for its duration by design, its default (2 minutes) included
    soak = budget.stage_factors("soak")
    assert budget.derive("soak", cpu_bf16(), None).timeout_s == soak.fixed_s + 120
    assert budget.derive("soak", cpu_bf16(), None, stage_config={"duration": "10h"}
                         ).timeout_s == soak.fixed_s + 36000
    # a config the stage cannot read adds nothing here (the config check refuses it earlier)
    assert budget.derive("evaluation", cpu_bf16(), SMOLLM2, stage_config={"limt": 5}
                         ).timeout_s == default.timeout_s
