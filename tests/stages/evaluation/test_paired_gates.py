"""Paired gates: schema, the metric catalog's patterns, judging per-item values, and the power
check before a run (exit 2 with the items needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from day0 import DATA_DIR
from day0.errors import ConfigError
from day0.verdict.gates import GatesFile, evaluate, load_gates
from day0.verdict.pipeline import check_gates
from tests.conftest import MODELS, ROOT

EXAMPLE = ROOT / "day0" / "stages" / "evaluation" / "data" / "business_example.jsonl"


def gates_file(tmp_path, gates):
    path = tmp_path / "gates.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "gates": gates}))
    return path


def test_the_shipped_gates_have_paired_evaluation_gates():
    parsed = load_gates()
    paired = {g.id: g.paired for g in parsed.gates if g.paired}
    assert {"eval-knowledge", "eval-all", "eval-all-gold-logprob"} <= set(paired)
    assert paired["eval-all-gold-logprob"].test == "bootstrap"


@pytest.mark.parametrize("gate,message", [
    ({"id": "g", "metric": "evaluation.knowledge.acc"}, "op and threshold, or paired"),
    ({"id": "g", "metric": "evaluation.knowledge.acc", "op": ">=", "threshold": 0.5,
      "paired": {"test": "mcnemar", "allowed_drop": 0.1}}, "no op, threshold"),
    ({"id": "g", "metric": "evaluation.knowledge.acc_drop",
      "paired": {"test": "mcnemar", "allowed_drop": 0.1}}, "not reported per item"),
    ({"id": "g", "metric": "evaluation.all.gold_logprob",
      "paired": {"test": "mcnemar", "allowed_drop": 0.1}}, "use test: bootstrap"),
    ({"id": "g", "metric": "evaluation.all.acc",
      "paired": {"test": "mcnemar", "allowed_drop": 0.1, "alpha": 0.7}}, "alpha"),
    ({"id": "g", "metric": "evaluation.all.acc",
      "paired": {"test": "mcnemar", "allowed_drop": 0.1, "margin": 0.01}}, "bootstrap"),
    ({"id": "g", "metric": "evaluation.all.acc",
      "paired": {"test": "mcnemar", "allowed_drop": 0.1, "alpah": 0.01}}, "alpah"),
    ({"id": "g", "metric": "evaluation.all.accuracy",
      "paired": {"test": "mcnemar", "allowed_drop": 0.1}}, "unknown metric"),
])
def test_bad_paired_gates_are_config_errors(tmp_path, gate, message):
    with pytest.raises(ConfigError, match=message):
        load_gates(gates_file(tmp_path, [gate]))


def judge(spec, reference, target, **extra):
    gates = GatesFile.model_validate({"gates": [
        {"id": "g", "metric": "evaluation.all.acc", "paired": spec}]})
    items = {"evaluation.all.acc": {"kind": "binary", "reference": reference, "target": target,
                                    "ids": [f"t:{i}" for i in range(len(reference))], **extra}}
    return evaluate(gates, {}, is_moe=False, paired=items)[0]


def test_a_regression_fails_with_p_and_the_flipped_items():
    ref = [1.0] * 200
    tgt = [0.0] * 25 + [1.0] * 175
    result = judge({"test": "mcnemar", "allowed_drop": 0.1}, ref, tgt)
    assert not result.passed and result.observed < 0.05 and result.op == ">="
    assert result.test["b"] == 25 and result.test["c"] == 0
    assert result.test["flipped_worse"][:2] == ["t:0", "t:1"]
    assert "exact McNemar" in result.reason


def test_balanced_flips_pass():
    ref = [1.0, 0.0] * 100
    tgt = [0.0, 1.0] * 5 + ref[10:]
    result = judge({"test": "mcnemar", "allowed_drop": 0.15}, ref, tgt)
    assert result.passed and result.observed > 0.05


def test_too_few_items_at_evaluation_fail_with_the_items_needed():
    result = judge({"test": "mcnemar", "allowed_drop": 0.05}, [1.0] * 30, [1.0] * 30)
    assert not result.passed
    assert "cannot detect" in result.reason and "needs" in result.reason


def test_a_missing_category_fails_once_with_the_reason():
    gates = GatesFile.model_validate({"gates": [
        {"id": "g", "metric": "evaluation.business.acc",
         "paired": {"test": "mcnemar", "allowed_drop": 0.2}}]})
    result = evaluate(gates, {}, is_moe=False, paired={},
                      missing_reasons={"evaluation": "failed: boom"})[0]
    assert not result.passed and result.not_evaluated == "stage evaluation: failed: boom"


def test_a_one_point_drop_on_40_items_is_a_config_error_with_the_items_needed():
    gates = GatesFile.model_validate({"gates": [
        {"id": "business-1pt", "metric": "evaluation.business.acc",
         "paired": {"test": "mcnemar", "allowed_drop": 0.01}}]})
    config = {"tasks": [], "business_file": str(EXAMPLE)}
    with pytest.raises(ConfigError) as err:
        check_gates(gates, {"evaluation": config}, [["analysis"], ["evaluation"]])
    assert "40 items" in str(err.value) and "needs 6181 items" in str(err.value)
    # the same gate at a detectable drop is fine
    ok = GatesFile.model_validate({"gates": [
        {"id": "business", "metric": "evaluation.business.acc",
         "paired": {"test": "mcnemar", "allowed_drop": 0.2}}]})
    check_gates(ok, {"evaluation": config}, [["evaluation"]])


def cli(*args):
    proc = subprocess.run([sys.executable, "-m", "day0.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc


def test_cli_exit_2_before_any_stage(tmp_path):
    gates = yaml.safe_load((DATA_DIR.parent.parent / "gates.yaml").read_text())
    gates["gates"].append({"id": "business-1pt", "metric": "evaluation.business.acc",
                           "paired": {"test": "mcnemar", "allowed_drop": 0.01}})
    path = tmp_path / "gates.yaml"
    path.write_text(yaml.safe_dump(gates))
    config = tmp_path / "stages.yaml"
    config.write_text(yaml.safe_dump({"evaluation": {"business_file": str(EXAMPLE)}}))
    proc = cli("validate", MODELS / "tiny-llama", "--gates", path, "--config", config)
    assert proc.returncode == 2, proc.stderr
    assert "needs 6181 items" in proc.stderr and "business-1pt" in proc.stderr
    # a malformed business row: exit 2 naming the file and the line
    bad = tmp_path / "bad.jsonl"
    bad.write_text(EXAMPLE.read_text().splitlines()[0] + "\n{\"prompt\": \"x\"}\n")
    config.write_text(yaml.safe_dump({"evaluation": {"business_file": str(bad)}}))
    proc = cli("validate", MODELS / "tiny-llama", "--config", config)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "bad.jsonl" in line and "line 2" in line and "answer" in line
