"""Evaluation time per fixture and per task: day0's evaluation stage vs lm-eval's own CLI on the
same task, side by side, in one run.

    python bench/bench_evaluation.py [--models tiny-llama,tiny-qwen3moe,tiny-deepseekv3]
                                     [--tasks day0_knowledge,...]

For each fixture and each bundled task (the long-context one built for the fixture's context,
as the stage builds it):

* day0: the evaluation stage (day0.stages.evaluation.run, reference: run) on cpu-bf16: the
  float32 reference and the bf16 target, both through lm-eval's Python API in one process;
* lm-eval CLI: ``python -m lm_eval --model hf`` on the same task YAML and data (the stage's task
  folder) at the stage's batch size, once in float32 and once in bfloat16 (the same two sides'
  work), each a fresh process (its start, with lm-eval indexing its task registry, included).

Prints seconds and items/s (items x 2 sides / seconds) for both, and their ratio; then the whole
stage (every task at once) per fixture. Figures only, nothing asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODELS = ROOT / "tests" / "fixtures" / "models"
TASKS = ["day0_knowledge", "day0_code", "day0_math", "day0_long_context", "day0_agent"]


def stage(model: Path, tasks: list[str]) -> tuple[float, int, int]:
    from day0.execution.contract import StageInputs
    from day0.stages.evaluation.core import Config, run
    from day0.execution.targets import resolve_target

    start = time.monotonic()
    result = run(Config(tasks=tasks, reference="run"),
                 StageInputs(source=str(model), target=resolve_target("cpu-bf16")))
    return time.monotonic() - start, sum(t.items for t in result.tasks), \
        result.settings["batch_size"]


def task_folder(model: Path, task: str, folder: Path) -> None:
    from day0.checkpoint.files import read_config_dict
    from day0.stages.evaluation.config import Config
    from day0.stages.evaluation.core import RESERVED_TOKENS
    from day0.stages.evaluation.tasks import prepare
    from day0.torchkit.evaltext import load_tokenizer

    config = Config(tasks=[task])
    context = int(read_config_dict(str(model)).get("max_position_embeddings") or 2048)
    prepare(config, folder, tokenizer=load_tokenizer(model),
            long_context_tokens=min(config.long_context_max_tokens, context) - RESERVED_TOKENS,
            lm_eval_version="")


def cli(model: Path, task: str, folder: Path, dtype: str, env: dict, batch: int) -> float:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
         f"pretrained={model},dtype={dtype}", "--tasks", task, "--include_path", str(folder),
         "--device", "cpu", "--batch_size", str(batch), "--seed", "1234"],
        env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        sys.exit(f"lm_eval failed on {task}:\n{proc.stderr[-2000:]}")
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny-llama,tiny-qwen3moe,tiny-deepseekv3")
    ap.add_argument("--tasks", default=",".join(TASKS))
    args = ap.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="day0-bench-eval-")
    os.environ.update({"DAY0_CACHE_DIR": cache, "HF_DATASETS_OFFLINE": "1",
                       "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    env = dict(os.environ)
    tasks = args.tasks.split(",")
    print(f"{'fixture':<17}{'task':<19}{'items':>6}{'day0 s':>9}{'items/s':>9}"
          f"{'lm-eval CLI s':>15}{'items/s':>9}{'CLI/day0':>10}")
    for name in args.models.split(","):
        model = MODELS / name
        for task in tasks:
            seconds, items, batch = stage(model, [task])
            with tempfile.TemporaryDirectory() as folder:
                task_folder(model, task, Path(folder))
                theirs = sum(cli(model, task, Path(folder), dtype, env, batch)
                             for dtype in ("float32", "bfloat16"))
            print(f"{name:<17}{task:<19}{items:>6}{seconds:>9.1f}{2 * items / seconds:>9.1f}"
                  f"{theirs:>15.1f}{2 * items / theirs:>9.1f}{theirs / seconds:>10.2f}",
                  flush=True)
        seconds, items, _ = stage(model, tasks)
        print(f"{name:<17}{'all (one stage)':<19}{items:>6}{seconds:>9.1f}"
              f"{2 * items / seconds:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
