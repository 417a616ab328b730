"""Calibrate the evaluation gates: correct stacks must PASS, capability-changing faults FAIL.

Each case runs the evaluation stage (day0.stages.evaluation.run: lm-eval, the bundled tasks,
the bundled business example) at default settings on a model and judges the shipped
evaluation gates (gates.yaml, `evaluation.*`). The float32 reference is computed once per model
and read back from the reference store by every other case (the stage's own reuse).

Prints per case: verdict of the evaluation gates, the failing gates with their p-values, the
smallest p over all paired gates (its margin: p / alpha, above 1 passes), per-category b/c and
the time. Nothing is asserted: figures only.

    python bench/calibrate_evaluation.py                 # SmolLM2-135M-Instruct (fetched, cached)
    python bench/calibrate_evaluation.py --fixtures      # the three bundled fixtures
    python bench/calibrate_evaluation.py --json out.json
    python bench/calibrate_evaluation.py --limit 60 --long-context-items 24 --long-context-tokens 1024
                                  # a CPU-sized run on SmolLM2 (full size: ~15 min per side here)
    python bench/calibrate_evaluation.py --tasks arc_easy,arc_challenge,hellaswag,piqa,winogrande \
        --limit 200 --repeats 5 --no-business
                                  # the standard tasks (scripts/fetch_benchmarks.py first); each
                                  # clean case 5 times (per-item results compared across repeats)
    python bench/calibrate_evaluation.py --suite quick   # a named suite (data/suites.yaml)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PLUGINS = ROOT / "tests" / "plugins"
EXAMPLE = ROOT / "day0" / "stages" / "evaluation" / "data" / "business_example.jsonl"

CASES = [  # name, dtype, plugins, must pass
    ("bf16", "bfloat16", [], True),
    ("fp16", "float16", [], True),
    ("bf16 1 thread", "bfloat16", ["stack_threads1"], True),
    ("bf16 torch.compile", "bfloat16", ["stack_compile"], True),
    ("noise on one layer (perturb_layer)", "bfloat16", ["perturb_layer"], False),
    ("int4 weights", "bfloat16", ["int4_weights"], False),
    ("RoPE base -10 %", "bfloat16", ["rope_base_low"], False),
    ("middle layer output x1.05", "bfloat16", ["scale_layer"], False),
]


def smollm2() -> str:
    env = {k: v for k, v in os.environ.items() if k != "DAY0_CACHE_DIR"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_real_models.py")],
                          capture_output=True, text=True, timeout=1200, env=env, check=True)
    return done.stdout.strip().splitlines()[-1]


def case(source: str, name: str, dtype: str, plugins: list[str], store: str,
         settings: dict, business: bool = True) -> dict:
    from day0.execution.contract import StageInputs
    from day0.verdict.gates import evaluate, load_gates
    from day0.stages.evaluation.core import Config, run
    from day0.execution.targets import Target

    target = Target(name=f"cpu-{dtype}", device="cpu", dtype=dtype,
                    plugins=[str(PLUGINS / f"{p}.py") for p in plugins])
    start = time.monotonic()
    extra = {"business_file": str(EXAMPLE)} if business else {}
    result = run(Config(reference_store=store, **extra, **settings),
                 StageInputs(source=source, target=target))
    seconds = time.monotonic() - start
    gates = [g for g in evaluate(load_gates(ROOT / "gates.yaml"), result.metrics(),
                                 is_moe=False, paired=result.paired_items,
                                 inapplicable=result.inapplicable)
             if g.metric.startswith("evaluation.") and g.applicable]
    paired = [g for g in gates if g.test]
    return {"case": name, "passed": all(g.passed for g in gates),
            "failed": {g.id: g.observed for g in gates if not g.passed},
            "min_p": min((g.observed, g.id) for g in paired),
            "categories": {c.category: [round(c.reference_acc, 3), round(c.target_acc, 3),
                                        c.b, c.c] for c in result.categories},
            "paired": {g.id: {k: g.test[k] for k in ("p_value", "drop", "mde", "n")}
                       for g in paired},
            "answers": {t: [(i["target"]["correct"], i["target"]["prediction"]) for i in rows]
                        for t, rows in result.items.items()},
            "reference": result.reference_source, "seconds": round(seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", action="store_true", help="the three bundled fixtures")
    ap.add_argument("--source", help="a checkpoint folder instead")
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--limit", type=int, help="items per task (lm-eval limit)")
    ap.add_argument("--long-context-items", type=int)
    ap.add_argument("--long-context-tokens", type=int)
    ap.add_argument("--tasks", help="comma-separated evaluation tasks (default: the stage's)")
    ap.add_argument("--suite", help="a named suite (data/suites.yaml) instead of --tasks")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each clean case")
    ap.add_argument("--no-business", action="store_true", help="without the business example")
    ap.add_argument("--store", help="keep the reference results here (default: a temporary "
                    "folder): a later invocation with the same settings reads them")
    args = ap.parse_args(argv)
    settings = {k: v for k, v in (("limit", args.limit),
                                  ("long_context_items", args.long_context_items),
                                  ("long_context_max_tokens", args.long_context_tokens),
                                  ("suite", args.suite),
                                  ("tasks", args.tasks and args.tasks.split(","))) if v}
    if args.tasks or args.suite:  # the standard tasks' data, where the fetch put it
        from day0.stages.evaluation import benchmarks

        settings["benchmarks_dir"] = str(benchmarks.default_dir())
    os.environ.setdefault("DAY0_CACHE_DIR", tempfile.mkdtemp(prefix="day0-cal-eval-"))
    sources = ([str(ROOT / "tests/fixtures/models" / m) for m in
                ("tiny-llama", "tiny-qwen3moe", "tiny-deepseekv3")] if args.fixtures
               else [args.source or smollm2()])
    wanted = set(args.cases.split(",")) if args.cases else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="day0-refs-") as temporary:
        store = args.store or temporary
        for source in sources:
            print(f"== {Path(source).name}")
            print(f"{'case':<36}{'must':<6}{'verdict':<9}{'min p (gate)':<32}{'s':>7}  failed")
            for name, dtype, plugins, must_pass in CASES:
                if wanted and name not in wanted:
                    continue
                for repeat in range(args.repeats if must_pass else 1):
                    row = case(source, name, dtype, plugins, store, settings,
                               not args.no_business) | {"model": Path(source).name,
                                                        "must_pass": must_pass,
                                                        "repeat": repeat + 1}
                    first = next((r for r in rows if r["case"] == name), None)
                    row["same_as_first"] = first is None or first["answers"] == row["answers"]
                    rows.append(row)
                    p, gate = row["min_p"]
                    label = f"{name} #{repeat + 1}" if must_pass and args.repeats > 1 else name
                    print(f"{label:<36}{'PASS' if must_pass else 'FAIL':<6}"
                          f"{'PASS' if row['passed'] else 'FAIL':<9}{f'{p:.3g} ({gate})':<32}"
                          f"{row['seconds']:>7}  {row['failed'] or ''}"
                          f"{'' if row['same_as_first'] else ' (answers differ from #1)'}",
                          flush=True)
                    print(f"{'':<6}categories (ref acc, target acc, b, c): {row['categories']}",
                          flush=True)
                    for gate, t in row["paired"].items():  # a drop below the MDE: undetectable
                        missed = not must_pass and gate not in row["failed"]
                        note = "  below the MDE: not detectable at this n" \
                            if missed and t["drop"] < t["mde"] else ""
                        print(f"{'':<6}{gate:<24} p {t['p_value']:<10.3g} drop {t['drop']:+.4f}"
                              f"  MDE {t['mde']:.3g} (n {t['n']}){note}", flush=True)
    clean = [r for r in rows if r["must_pass"]]
    faults = [r for r in rows if not r["must_pass"]]
    print(f"false alarms: {sum(not r['passed'] for r in clean)}/{len(clean)}; faults caught: "
          f"{sum(not r['passed'] for r in faults)}/{len(faults)}")
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "answers"}
                                               for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
