"""A real model's published scores next to lm-eval's own tasks run here, offline, on day0's
fetched test sets (scripts/fetch_benchmarks.py): the table docs/evaluation.md gives, each gap
with its reason (bench/published/<model>.yaml) and the measured figure's 95 % interval.

Run: .venv/bin/python bench/published_scores.py [--source FOLDER] [--limit 500]
     [--mmlu-limit 20] [--gsm8k-limit 100] [--batch-size 16] [--json out.json]

The model defaults to SmolLM2-135M-Instruct as scripts/fetch_real_models.py makes it. Each task
runs through `lm-eval run --model hf` (float32, CPU) with day0's task YAMLs (lm-eval's own
configs, the data source changed: day0.stages.evaluation.benchmarks), `--limit` items per task
(lm-eval takes the first N of the split); mmlu is lm-eval's 57 subject tasks, `--mmlu-limit`
each, pooled. Prints one markdown row per published figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PUBLISHED = Path(__file__).parent / "published" / "smollm2-135m-instruct.yaml"
METRIC_KEYS = {"acc": "acc,none", "acc_norm": "acc_norm,none",
               "exact_match": "exact_match,strict-match"}


def real_model() -> Path:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_real_models.py")],
                          capture_output=True, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def run_lm_eval(source: Path, tasks: dict[str, str], limit: int, batch_size: int,
                work: Path) -> dict[str, dict]:
    """lm-eval's CLI on these task YAMLs: per task its results row and its item count."""
    include = work / "tasks"
    include.mkdir(parents=True, exist_ok=True)
    for name, text in tasks.items():
        (include / f"{name}.yaml").write_text(text)
    out = work / "out"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args",
         f"pretrained={source},dtype=float32", "--tasks", ",".join(tasks), "--include_path",
         str(include), "--limit", str(limit), "--batch_size", str(batch_size), "--device", "cpu",
         "--output_path", str(out)],
        capture_output=True, text=True, env=env, cwd=work)
    if done.returncode != 0:
        sys.exit(f"lm-eval failed on {', '.join(tasks)}:\n{done.stderr[-3000:]}")
    results = json.loads(max(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
                         .read_text())
    return {name: {**results["results"][name],
                   "n": int(results["n-samples"][name]["effective"])} for name in tasks}


def pooled(rows: list[dict], key: str) -> tuple[float, int]:
    """The item-weighted mean of a metric over the lm-eval tasks one task runs as (mmlu's 57
    subjects; one row for the others), and the items."""
    n = sum(r["n"] for r in rows)
    return sum(float(r[key]) * r["n"] for r in rows) / n, n


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson interval of a proportion (sound near 0, unlike p +- 1.96 se: GSM8K's
    ~1 % on 100 items)."""
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, help="a checkpoint folder (default: SmolLM2)")
    parser.add_argument("--published", type=Path, default=PUBLISHED)
    parser.add_argument("--limit", type=int, default=500, help="items per task")
    parser.add_argument("--mmlu-limit", type=int, default=20, help="items per mmlu subject")
    parser.add_argument("--gsm8k-limit", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()

    from day0.stages.evaluation import benchmarks

    card = yaml.safe_load(args.published.read_text())
    source = args.source or real_model()
    data_dir = benchmarks.default_dir()
    names = sorted({t for row in card["rows"] for t in row["tasks"]})
    for name in names:
        benchmarks.fetch(name)
    limits = {"mmlu": args.mmlu_limit, "gsm8k_cot": args.gsm8k_limit}
    measured: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="day0-published-") as tmp:
        by_limit: dict[int, list[str]] = {}
        for name in names:
            by_limit.setdefault(limits.get(name, args.limit), []).append(name)
        for limit, group in sorted(by_limit.items()):
            tasks = {k: v for name in group for k, v in benchmarks.task_yamls(name, data_dir).items()}
            started = time.perf_counter()
            measured.update(run_lm_eval(source, tasks, limit, args.batch_size,
                                        Path(tmp) / f"limit-{limit}"))
            seconds[",".join(group)] = time.perf_counter() - started

    table = []
    for row in card["rows"]:
        entry = {"published": row["published"], "card": row["value"], "why": row["why"]}
        if row["tasks"]:
            key = METRIC_KEYS[row["metric"]]
            parts = []
            for name in row["tasks"]:
                subtasks = list(benchmarks.lm_eval_tasks(name))
                parts.append(pooled([measured[t] for t in subtasks], key))
            # ARC (Average): the mean of the two sets' accuracies, as the card averages them
            # (and of their intervals' bounds: wider than the mean's own, never narrower)
            p = sum(v for v, _ in parts) / len(parts)
            low, high = (sum(b) / len(parts) for b in zip(*(wilson(v, k) for v, k in parts)))
            entry.update({"tasks": row["tasks"], "metric": row["metric"], "measured": 100 * p,
                          "ci95": [100 * low, 100 * high], "n": sum(k for _, k in parts),
                          "gap": 100 * p - row["value"],
                          "card_within_ci": 100 * low <= row["value"] <= 100 * high})
        table.append(entry)

    print(f"\n{card['model']} ({source}): lm-eval, float32 CPU; card: {card['source']}\n")
    print("| published | card | measured here (lm-eval task, metric, n) | 95 % interval | gap (card outside the interval?) | why |")
    print("|---|---|---|---|---|---|")
    for e in table:
        if "measured" in e:
            print(f"| {e['published']} | {e['card']} | {e['measured']:.1f} ({', '.join(e['tasks'])}, "
                  f"{e['metric']}, {e['n']}) | {e['ci95'][0]:.1f}-{e['ci95'][1]:.1f} | "
                  f"{e['gap']:+.1f}{'' if e['card_within_ci'] else ' (outside)'} | {e['why']} |")
        else:
            print(f"| {e['published']} | {e['card']} | not measured | | | {e['why']} |")
    print(f"\nweights: {card['weights']}")
    print("seconds: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))
    if args.json:
        args.json.write_text(json.dumps({"source": str(source), "rows": table,
                                         "seconds": seconds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
