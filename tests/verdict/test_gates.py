import math

import pytest
import yaml

from day0.errors import ConfigError
from day0.verdict.gates import catalog_entry, evaluate, load_gates, metric_catalog, verdict


def write(tmp_path, data, name="gates.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def gate(**kw):
    return {"id": "g", "metric": "alignment.logits.kl_mean", "op": "<=", "threshold": 0.01, **kw}


def test_shipped_gates_load_and_name_known_metrics():
    parsed = load_gates()
    catalog = metric_catalog()
    assert parsed.gates and all(catalog_entry(g.metric, catalog) for g in parsed.gates)
    # a pattern entry stands for one name segment only
    assert catalog_entry("evaluation.knowledge.acc", catalog)["paired"] == "binary"
    assert catalog_entry("evaluation.a.b.acc", catalog) is None
    assert catalog_entry("evaluation..acc", catalog) is None


def test_unknown_metric_is_config_error_with_did_you_mean(tmp_path):
    path = write(tmp_path, {"gates": [gate(metric="alignment.logits.kl_maen")]})
    with pytest.raises(ConfigError) as err:
        load_gates(path)
    text = str(err.value)
    assert "alignment.logits.kl_maen" in text and "did you mean 'alignment.logits.kl_mean'" in text
    assert str(path) in text and "gates.0.metric" in text


def test_every_problem_reported_at_once(tmp_path):
    path = write(tmp_path, {"gates": [gate(metric="nope.metric"), gate(id="g", op="=<"),
                                      gate(id="h", thresold=1)]})
    with pytest.raises(ConfigError) as err:
        load_gates(path)
    fields = {p.field for p in err.value.problems}
    assert {"gates.1.op", "gates.2.thresold"} <= fields
    assert "did you mean 'threshold'" in str(err.value)


def test_semantic_problems_all_reported(tmp_path):
    path = write(tmp_path, {"gates": [gate(metric="nope.metric"), gate()]})
    with pytest.raises(ConfigError) as err:
        load_gates(path)
    messages = " ".join(p.message for p in err.value.problems)
    assert "unknown metric" in messages and "duplicate gate id" in messages


def test_empty_and_unparsable_files(tmp_path):
    with pytest.raises(ConfigError, match="no gates"):
        load_gates(write(tmp_path, {"gates": []}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("gates: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_gates(bad)
    with pytest.raises(ConfigError, match="file not found"):
        load_gates(tmp_path / "missing.yaml")


@pytest.fixture
def gates(tmp_path):
    return load_gates(write(tmp_path, {"gates": [
        gate(id="kl"),
        gate(id="top1", metric="alignment.logits.top1_agreement", op=">=", threshold=0.95),
        gate(id="moe", metric="alignment.moe.expert_agreement", op=">=", threshold=0.9,
             applies_to="moe"),
        gate(id="warn", metric="scan.coverage", op=">=", threshold=1.0, severity="warning"),
    ]}))


def test_pass_and_fail_with_reasons(gates):
    results = evaluate(gates, {"alignment.logits.kl_mean": 0.001, "alignment.logits.top1_agreement": 0.5,
                               "scan.coverage": 1.0}, is_moe=False)
    by_id = {r.id: r for r in results}
    assert by_id["kl"].passed and "holds" in by_id["kl"].reason
    assert not by_id["top1"].passed and "violated" in by_id["top1"].reason
    assert by_id["moe"].passed and not by_id["moe"].applicable
    assert verdict(results, {}) == "FAIL"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_never_passes(gates, bad):
    results = evaluate(gates, {"alignment.logits.kl_mean": bad, "alignment.logits.top1_agreement": bad,
                               "scan.coverage": 1.0}, is_moe=False)
    kl, top1 = results[0], results[1]
    assert not kl.passed and not top1.passed and "not finite" in kl.reason
    assert verdict(results, {}) == "FAIL"


def test_missing_metric_fails_with_stage_reason(gates):
    results = evaluate(gates, {"scan.coverage": 1.0}, is_moe=True,
                       missing_reasons={"alignment": "failed: boom"})
    assert all(not r.passed for r in results[:3])
    assert results[0].reason == "not evaluated (stage alignment: failed: boom)"
    assert results[0].not_evaluated == "stage alignment: failed: boom"
    assert verdict(results, {"alignment": "boom"}) == "ERROR"


def test_warning_does_not_fail_verdict(gates):
    results = evaluate(gates, {"alignment.logits.kl_mean": 0.0, "alignment.logits.top1_agreement": 1.0,
                               "alignment.moe.expert_agreement": 1.0, "scan.coverage": 0.5}, is_moe=True)
    assert not results[3].passed and verdict(results, {}) == "PASS"


def test_verdict_order_error_then_broken_then_fail(gates):
    failing = evaluate(gates, {"alignment.logits.kl_mean": 1.0, "alignment.logits.top1_agreement": 1.0,
                               "scan.coverage": 1.0}, is_moe=False)
    passing = evaluate(gates, {"alignment.logits.kl_mean": 0.0, "alignment.logits.top1_agreement": 1.0,
                               "scan.coverage": 1.0}, is_moe=False)
    broken = ["model-00001-of-00004.safetensors: every one of its 10 tensors is zero"]
    assert verdict(failing, {"scan": "crashed"}, broken) == "ERROR"
    assert verdict(failing, {}, broken) == "BROKEN"
    assert verdict(passing, {}, broken) == "BROKEN"
    assert verdict(failing, {}, []) == "FAIL" and verdict(passing, {}, []) == "PASS"


def test_gates_of_stages_that_do_not_run_on_the_target_kind_are_not_applicable():
    """An engine target: the in-process alignment/scan gates do not apply (not failed), the
    engine stages' gates do; a torch target: the other way round (pipeline.conclude)."""
    from day0.verdict import pipeline
    from day0.execution.targets import resolve_target

    gates = load_gates()
    engine, torch_target = resolve_target("vllm-cpu-bf16"), resolve_target("cpu-bf16")
    for target, absent, present in ((engine, "alignment.", "smoke."),
                                    (torch_target, "smoke.", "alignment.")):
        results = pipeline.conclude(gates, target, {}, {}, {}).gate_results
        off = [r for r in results if r.metric.startswith(absent)]
        on = [r for r in results if r.metric.startswith(present) and r.applicable]  # dense
        assert off and all(not r.applicable and r.passed and "does not run on" in r.reason
                           for r in off)
        assert on and all(not r.passed and r.not_evaluated for r in on)


def test_a_partial_run_is_judged_on_what_ran():
    """`--stages alignment`: the gates of the stages not selected are "not selected" (shown,
    neither failed nor counted); a selected stage's gates are judged as always, and one that
    was planned but did not run still fails its gates."""
    from day0 import stages
    from day0.execution.stage import StageOutcome
    from day0.execution.targets import resolve_target
    from day0.verdict import pipeline

    gates, target = load_gates(), resolve_target("cpu-bf16")
    waves = stages.plan(["alignment"], "torch")
    planned = pipeline.partial(waves, "torch")
    assert planned == ["analysis", "alignment"]
    assert pipeline.partial(stages.plan(None, "torch"), "torch") == []  # the full plan
    everything = [n for wave in stages.plan(None, "torch") for n in wave]
    assert pipeline.partial(stages.plan(everything, "torch"), "torch") == []  # all named

    alignment = [g for g in gates.gates if g.metric.startswith("alignment.")
                 and g.applies_to != "moe"]
    holding = {g.metric: g.by_claim.get(target.claim, g.threshold) for g in alignment
               if "{" not in g.metric}
    holding["analysis.plan_fits"] = 1.0
    outcomes = {"analysis": StageOutcome(stage="analysis", ok=True,
                                         metrics={"analysis.plan_fits": 1.0}),
                "alignment": StageOutcome(stage="alignment", ok=True, metrics=holding)}
    concluded = pipeline.conclude(gates, target, outcomes, {}, {}, planned=planned)
    assert concluded.verdict == "PASS", [r.reason for r in concluded.gate_results if not r.passed]
    unselected = [r for r in concluded.gate_results if r.not_selected]
    assert {r.metric.split(".")[0] for r in unselected} == {"scan", "evaluation", "performance"}
    assert all(r.passed and not r.applicable and r.reason.startswith("not selected: stage ")
               for r in unselected)
    # the same outcomes judged as a full run: the stages that did not run fail their gates
    full = pipeline.conclude(gates, target, outcomes, {}, {})
    assert full.verdict == "FAIL" and not any(r.not_selected for r in full.gate_results)
    # a selected gate that does not hold still fails a partial run
    worse = {**holding, "alignment.logits.kl_mean": 10.0}
    outcomes["alignment"] = StageOutcome(stage="alignment", ok=True, metrics=worse)
    assert pipeline.conclude(gates, target, outcomes, {}, {}, planned=planned).verdict == "FAIL"
    # a planned stage that did not run (its requirement failed) is not evaluated: it fails
    outcomes = {"analysis": StageOutcome(stage="analysis", ok=False, failure="crash",
                                         error="killed")}
    skipped = {"alignment": "not run: analysis failed"}
    results = pipeline.conclude(gates, target, outcomes, skipped, {}, planned=planned)
    assert results.verdict == "ERROR"
    assert all(not r.passed and r.not_evaluated for r in results.gate_results
               if r.metric.startswith("alignment.") and r.applicable)


def test_a_stage_that_ran_without_a_gated_metric_fails_that_gate_saying_so():
    """The stage finished but did not report the metric a gate reads: that gate fails with
    'ran without reporting this metric', never 'not selected' (pipeline.conclude)."""
    from day0.execution.stage import StageOutcome
    from day0.execution.targets import resolve_target
    from day0.verdict import pipeline

    gates = load_gates()
    outcomes = {"evaluation": StageOutcome(stage="evaluation", ok=True,
                                           metrics={"evaluation.all.acc": 0.5})}
    results = pipeline.conclude(gates, resolve_target("cpu-bf16"), outcomes, {}, {}).gate_results
    code = next(r for r in results if r.id == "eval-code")
    assert not code.passed and code.not_evaluated
    assert "evaluation: ran without reporting this metric" in code.reason, code.reason
