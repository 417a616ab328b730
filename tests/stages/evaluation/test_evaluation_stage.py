"""The evaluation stage on the tiny-llama fixture with real lm-eval: a correct bf16 target
passes the shipped evaluation gates, the layer-perturbation fault fails one with p < alpha and
its flipped items listed, the reference is computed once and read back from the object store by
the next target, and day0's reference scores equal lm-eval's own `hf` model's."""

from __future__ import annotations

import json
import os

import pytest

from day0.execution.contract import StageInputs
from day0.verdict.gates import evaluate, load_gates
from day0.execution.stage import StageSpec, execute
from day0.execution.targets import Target
from tests.conftest import MODELS, PLUGINS, ROOT

TINY_LLAMA = MODELS / "tiny-llama"
EXAMPLE = ROOT / "day0" / "stages" / "evaluation" / "data" / "business_example.jsonl"
BUSINESS_GATE = {"id": "eval-business", "metric": "evaluation.business.acc",
                 "paired": {"test": "mcnemar", "allowed_drop": 0.25}}


def target(*plugins: str) -> Target:
    return Target(name="cpu-bf16-test", device="cpu", dtype="bfloat16",
                  plugins=[str(PLUGINS / p) for p in plugins])


@pytest.fixture(scope="module")
def store(s3_server):
    bucket = s3_server.create_bucket("day0-eval-refs")
    with s3_server.exported():
        yield f"s3://{bucket}/references"


def run_stage(store: str, *plugins: str):
    from day0.stages.evaluation.core import Result

    config = {"business_file": str(EXAMPLE), "reference_store": store}
    outcome = execute(StageSpec(stage="evaluation", config=config,
                                inputs=StageInputs(source=str(TINY_LLAMA),
                                                   target=target(*plugins))))
    assert outcome.ok, outcome.error
    result = Result.model_validate(outcome.result)
    assert outcome.metrics == result.metrics()
    return result


def judge(result) -> dict:
    """The shipped evaluation gates plus a business gate: id -> GateResult."""
    gates = load_gates(ROOT / "gates.yaml")
    gates.gates.append(type(gates.gates[0]).model_validate(BUSINESS_GATE))
    results = evaluate(gates, result.metrics(), is_moe=False, paired=result.paired_items,
                       inapplicable=result.inapplicable)
    return {g.id: g for g in results if g.metric.startswith("evaluation.")}


@pytest.fixture(scope="module")
def correct(store):
    return run_stage(store)


@pytest.fixture(scope="module")
def faulty(store, correct):  # after `correct`: reads the reference it stored
    # noise on layer 0 of 4: eval-knowledge p = 0.0009 on the calibration machine of
    # docs/evaluation.md and on an AVX512-BF16 Xeon. Layer 1 gave p = 0.011 on the first and
    # 0.059 on the second: the CPU's bf16 kernels decide which fixture answers flip, too close
    # to alpha for a test.
    os.environ["DAY0_PERTURB_LAYER"] = "0"
    try:
        return run_stage(store, "perturb_layer.py")
    finally:
        del os.environ["DAY0_PERTURB_LAYER"]


def test_a_correct_bf16_target_passes_every_evaluation_gate(correct):
    gates = judge(correct)
    assert len(gates) == 10 and all(g.passed for g in gates.values()), \
        {i: g.reason for i, g in gates.items() if not g.passed}
    # no bundled task is commonsense (the standard hellaswag, piqa, winogrande are)
    assert [i for i, g in gates.items() if not g.applicable] == ["eval-commonsense"]
    cats = {c.category: c for c in correct.categories}
    assert set(cats) == {"knowledge", "code", "math", "long_context", "agent", "business", "all"}
    assert cats["business"].items == 40 and cats["all"].items == 120 * 4 + 60 + 40
    # the fixtures answer the static tasks well above chance (0.25): a fault has room to show
    for name in ("knowledge", "code", "math", "agent"):
        assert cats[name].reference_acc >= 0.5, (name, cats[name].reference_acc)
    assert correct.reference_source == "computed"
    assert correct.reference_uri.startswith("s3://day0-eval-refs/references/")


def test_the_report_records_what_reproduces_it(correct):
    assert correct.lm_eval_version and correct.target_model == "day0"
    assert correct.settings["seeds"] == {"random": 1234, "numpy": 1234, "torch": 1234,
                                         "fewshot": 1234}
    for task in correct.tasks:
        assert len(task.config_hash) == 16 and len(task.data_hash) == 16
        assert task.n_shot == 0 and task.version is not None
    from day0.stages.evaluation.report import files

    written = files(correct.model_dump(mode="json"))
    rows = [json.loads(line) for line in written["evaluation/day0_knowledge.jsonl"].splitlines()]
    assert len(rows) == 120 and {"reference", "target", "gold", "doc_hash"} <= set(rows[0])


def test_the_layer_fault_fails_with_p_below_alpha_and_the_flipped_items(faulty):
    gates = judge(faulty)
    failed = {i: g for i, g in gates.items() if not g.passed}
    assert failed, {i: g.reason for i, g in gates.items()}
    worst = min(failed.values(), key=lambda g: g.observed)
    assert worst.test["test"] == "mcnemar" and worst.observed < worst.threshold, worst.reason
    assert worst.test["b"] > worst.test["c"] and worst.test["flipped_worse"]
    assert worst.test["flipped_worse_count"] == worst.test["b"]
    task = worst.test["flipped_worse"][0].split(":")[0]
    assert task.startswith("day0_")
    flipped = [f for t in faulty.tasks for f in t.flipped if f.direction == "target worse"]
    assert flipped and all(f.reference_prediction != f.target_prediction for f in flipped)


def test_the_second_target_reads_the_stored_reference(correct, faulty):
    assert faulty.reference_source == "stored"
    assert faulty.reference_uri == correct.reference_uri
    # no reference forward ran: reading it takes a fraction of computing it
    assert faulty.timings["reference"] < 0.2 * correct.timings["reference"], \
        (faulty.timings, correct.timings)
    ref = {(t.task): t.reference_score for t in correct.tasks}
    assert {t.task: t.reference_score for t in faulty.tasks} == ref


def test_reference_scores_equal_lm_eval_own_hf_model(correct, tmp_path):
    """lm-eval's `hf` model on the same task file, checkpoint, n-shot and seeds gives the same
    per-item correctness as day0's reference side (its `day0` model: day0's loader)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from day0.stages.evaluation.config import Config
    from day0.stages.evaluation.tasks import prepare
    from day0.torchkit.evaltext import load_tokenizer

    prepare(Config(tasks=["day0_knowledge"]), tmp_path, tokenizer=load_tokenizer(TINY_LLAMA),
            long_context_tokens=248, lm_eval_version="")
    out = simple_evaluate(model="hf", model_args=f"pretrained={TINY_LLAMA},dtype=float32",
                          tasks=["day0_knowledge"], device="cpu",
                          batch_size=correct.settings["batch_size"],
                          log_samples=True,
                          task_manager=TaskManager(include_path=str(tmp_path),
                                                   include_defaults=False),
                          bootstrap_iters=0, random_seed=1234, numpy_random_seed=1234,
                          torch_random_seed=1234, fewshot_random_seed=1234)
    theirs = {int(s["doc_id"]): float(s["acc"]) for s in out["samples"]["day0_knowledge"]}
    ours = {r["doc_id"]: r["reference"]["correct"] for r in correct.items["day0_knowledge"]}
    assert theirs == ours
    row = next(t for t in correct.tasks if t.task == "day0_knowledge")
    assert out["results"]["day0_knowledge"]["acc,none"] == pytest.approx(row.reference_score,
                                                                         abs=1e-12)
