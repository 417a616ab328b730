"""Calibration of the performance baseline gates on a real engine: clean repeats must PASS, a
slowed engine must FAIL, with the spread written down.

    python bench/calibrate_performance.py [--model FOLDER] [--repeats 5]
        [--slowed "--max-num-seqs 1"] [--json]

The default model is scripts/make_perf_model.py's 37 M-parameter Llama (made in a temp dir):
engine-bound serving, like a real model's. tiny-llama (--model tests/fixtures/models/tiny-llama)
shows what a model too small for its engine does on 2 cores: vLLM's API server becomes the
bottleneck, streamed tokens arrive in bursts, and clean repeats scatter as much as a slowed
engine.

Launches the built-in vllm-cpu-bf16 target's engine (plain configuration) on the model, runs
the performance stage once and promotes it to baseline (a scratch store), then runs it
--repeats more times against that baseline (clean repeats: same engine, same requests), then
launches the engine again with the --slowed arguments and runs it once more. Prints per run
and workload the slowdown ratio of each latency (median) with its interval's bounds, and each
run's baseline gate results from the shipped gates.yaml. Needs `make engine`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from day0.execution.contract import StageInputs  # noqa: E402
from day0.engines.process import launched  # noqa: E402
from day0.verdict.gates import evaluate, load_gates  # noqa: E402
from day0.execution.stage import StageSpec, execute  # noqa: E402
from day0.stages.performance.core import Result  # noqa: E402
from day0.execution.targets import resolve_target  # noqa: E402


def measure(model: str, endpoint, store: str, **config) -> Result:
    target = resolve_target("vllm-cpu-bf16")
    outcome = execute(StageSpec(stage="performance", config={"baseline_store": store, **config},
                                inputs=StageInputs(source=model, target=target,
                                                   endpoint=endpoint)))
    if not outcome.ok:
        sys.exit(f"performance stage failed: {outcome.error}")
    return Result.model_validate(outcome.result)


def judged(result: Result) -> dict[str, tuple[bool, str]]:
    gates = evaluate(load_gates(ROOT / "gates.yaml"), result.metrics(), is_moe=False,
                     inapplicable=result.inapplicable)
    # warnings are reported, not judged (the verdict's rule)
    return {g.id: (g.passed or g.severity == "warning", g.reason) for g in gates
            if g.metric.startswith("performance.")}


def row(label: str, result: Result, kinds: dict[str, str] | None = None) -> dict:
    """A run's verdict on the performance gates and its slowdowns (kinds: which ones, renamed;
    default TTFT, TPOT, E2EL)."""
    kinds = kinds or {"ttft": "ttft", "tpot": "tpot", "e2el": "e2el"}
    gates = judged(result)
    return {"run": label,
            "verdict": "PASS" if all(ok for ok, _ in gates.values()) else "FAIL",
            "failed_gates": {k: why for k, (ok, why) in gates.items() if not ok},
            "slowdowns": [{"run": s.run, "kind": kinds[s.kind], "ratio": s.ratio, "low": s.low,
                           "high": s.high} for s in result.slowdowns if s.kind in kinds],
            "attempts": result.attempts, "notes": result.notes}


def show(r: dict) -> None:
    """One run's lines: verdict, each slowdown with its interval, re-measured runs, failures."""
    print(f"== {r['run']}: {r['verdict']}")
    for s in r["slowdowns"]:
        print(f"   {s['run']:<18} {s['kind']:<7} ratio {s['ratio']:.2f} "
              f"[{s['low']:.2f}, {s['high']:.2f}]")
    for run_id, lows in r["attempts"].items():
        print(f"   {run_id:<18} measured again to confirm; largest lower bound per "
              f"attempt: {', '.join('-' if x is None else f'{x:.2f}' for x in lows)}")
    for gate, why in r["failed_gates"].items():
        print(f"   FAIL {gate}: {why}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the perf model)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slowed", default="--max-num-seqs 1")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = resolve_target("vllm-cpu-bf16").engine
    rows = []
    with tempfile.TemporaryDirectory(prefix="day0-calibrate-perf-") as store:
        if args.model is None:
            from scripts.make_perf_model import make

            args.model = str(make(Path(store) / "perf-llama"))
        with launched(settings, args.model, "bfloat16", name="plain") as engine:
            measure(args.model, engine.endpoint, store, promote_baseline=True)
            for i in range(args.repeats):
                rows.append(row(f"clean repeat {i + 1}", measure(args.model, engine.endpoint,
                                                                 store)))
        with launched(settings, args.model, "bfloat16", extra_args=shlex.split(args.slowed),
                      name="slowed") as engine:
            rows.append(row(f"slowed ({args.slowed})", measure(args.model, engine.endpoint,
                                                              store)))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        show(r)
    clean = [r for r in rows if r["run"].startswith("clean")]
    print(f"clean repeats passing: {sum(r['verdict'] == 'PASS' for r in clean)} of {len(clean)}; "
          f"slowed: {rows[-1]['verdict']}")
    lows = {}
    for r in clean:
        for s in r["slowdowns"]:
            lows.setdefault(s["kind"], []).append(s["low"])
    for kind, values in lows.items():
        print(f"largest lower bound on clean repeats, {kind}: {max(values):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
