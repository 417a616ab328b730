"""The evaluation stage on an engine target: lm-eval's local-completions against a real vLLM
for CPU serving tiny-llama in bf16, paired with the float32 reference; its scores agree with
the in-process bf16 target's within the shipped gates."""

from __future__ import annotations

import pytest

from day0.verdict import statistics
from day0.execution.contract import StageInputs
from day0.verdict.gates import evaluate, load_gates
from day0.execution.stage import StageSpec, execute
from day0.execution.targets import resolve_target
from tests.conftest import ROOT
from tests.engines.conftest import TINY_LLAMA, engine_target

pytestmark = pytest.mark.engine


def run_stage(target, endpoint=None):
    from day0.stages.evaluation.core import Result

    outcome = execute(StageSpec(stage="evaluation", config={},
                                inputs=StageInputs(source=str(TINY_LLAMA), target=target,
                                                   endpoint=endpoint)))
    assert outcome.ok, outcome.error
    return Result.model_validate(outcome.result)


@pytest.fixture(scope="module")
def in_process():
    return run_stage(resolve_target("cpu-bf16"))


@pytest.fixture(scope="module")
def served(tiny_llama_engine, in_process):  # after in_process: reads the reference it stored
    return run_stage(engine_target(), tiny_llama_engine)


def test_the_engine_passes_every_evaluation_gate_through_local_completions(served):
    assert served.target_model == "local-completions"
    assert served.reference_source == "stored"
    results = evaluate(load_gates(ROOT / "gates.yaml"), served.metrics(), is_moe=False,
                       paired=served.paired_items, inapplicable=served.inapplicable)
    mine = [g for g in results if g.metric.startswith("evaluation.")]
    assert len(mine) == 9 and all(g.passed for g in mine), \
        {g.id: g.reason for g in mine if not g.passed}
    assert [g.id for g in mine if not g.applicable] == ["eval-commonsense"]  # no such task here
    assert served.nonfinite == 0


def test_engine_and_in_process_bf16_agree_item_by_item(served, in_process):
    """The same items answered by vLLM and by transformers, both bf16: a paired test between
    them finds no drop either way at the shipped gates' alpha, and the scores are close."""
    engine = served.paired_items["evaluation.all.acc"]
    local = in_process.paired_items["evaluation.all.acc"]
    assert engine["ids"] == local["ids"]
    for a, b in ((local["target"], engine["target"]), (engine["target"], local["target"])):
        test = statistics.mcnemar(a, b, allowed_drop=0.08)
        assert not test.regressed, test.summary()
    for e, i in zip(served.categories, in_process.categories):
        assert e.category == i.category
        assert abs(e.target_acc - i.target_acc) <= 0.05, (e.category, e.target_acc, i.target_acc)
    agree = sum(a == b for a, b in zip(engine["target"], local["target"])) / len(engine["ids"])
    assert agree >= 0.95, agree
