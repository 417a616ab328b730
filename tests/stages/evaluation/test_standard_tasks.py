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
from day0.stages.evaluation import benchmarks, tasks
from day0.stages.evaluation.config import Config
from day0.verdict.gates import evaluate, load_gates
from tests.conftest import ROOT

STANDARD = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "winogrande")


@pytest.fixture(scope="session")
def benchmarks_dir() -> Path:
    """Every benchmark, fetched once per machine (scripts/fetch_benchmarks.py)."""
    env = {k: v for k, v in os.environ.items() if k != "DAY0_CACHE_DIR"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_benchmarks.py")],
                          capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.strip().splitlines()[-1]).parent


def test_the_fetched_splits_have_the_official_sizes(benchmarks_dir):
    for name in STANDARD:
        bench = benchmarks.standard_tasks()[name]
        for file, data in bench.files.items():
            lines = (benchmarks_dir / name / file).read_text().splitlines()
            assert len(lines) == data.rows, (name, file)
    arc = json.loads((benchmarks_dir / "arc_easy" / "test.jsonl").read_text().splitlines()[0])
    assert set(arc) == {"id", "question", "choices", "answerKey"}  # the hub's fields


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
    (folder / "arc_easy.yaml").write_text(benchmarks.task_yaml("arc_easy", benchmarks_dir))
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
