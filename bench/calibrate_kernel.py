"""Calibration of the kernel-profile baseline gates (device targets): clean repeats must PASS, a
slower kernel must FAIL, with the spread written down.

    python bench/calibrate_kernel.py [--model FOLDER] [--repeats 5] [--fault slow_linear]
        [--device cpu --dtype bfloat16] [--json]

Runs the performance stage on an in-process target (default cpu/bfloat16) for the model
(default SmolLM2-135M-Instruct, fetched and cached by scripts/fetch_real_models.py), promotes the
first run to baseline (a scratch store), runs it --repeats more times against it (clean), then
once with the fault plugin applied (tests/plugins/<fault>.py; slow_linear computes every
nn.Linear twice: same numbers, twice the matmul time). Prints per run and workload the prefill
and decode slowdown ratios with their intervals, and each run's kernel gates from the shipped
gates.yaml.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from day0.execution.contract import StageInputs  # noqa: E402
from day0.execution.stage import StageSpec, execute  # noqa: E402
from day0.stages.performance.core import Result  # noqa: E402
from day0.execution.targets import Target  # noqa: E402

from bench.calibrate_performance import row as judged_row, show  # noqa: E402

NAMES = {"ttft": "prefill", "tpot": "decode"}


def measure(model: str, target: Target, store: str, **config) -> Result:
    outcome = execute(StageSpec(stage="performance", config={"baseline_store": store, **config},
                                inputs=StageInputs(source=model, target=target)))
    if not outcome.ok:
        sys.exit(f"performance stage failed: {outcome.error}")
    return Result.model_validate(outcome.result)


def row(label: str, result: Result) -> dict:
    return {**judged_row(label, result, NAMES),
            "profile": [{"run": r.run, "prefill_tokens_per_s": r.prefill_tokens_per_s,
                         "decode_ms_per_token": r.decode_ms_per_token} for r in result.runs]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint folder (default: SmolLM2)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fault", default="slow_linear")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.model is None:
        out = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_real_models.py")],
                             check=True, capture_output=True, text=True).stdout
        args.model = out.strip().splitlines()[-1]
    clean = Target(name=f"{args.device}-{args.dtype}", device=args.device, dtype=args.dtype)
    slowed = clean.model_copy(update={"plugins": [str(ROOT / "tests" / "plugins" /
                                                      f"{args.fault}.py")]})
    rows = []
    with tempfile.TemporaryDirectory(prefix="day0-calibrate-kernel-") as store:
        rows.append(row("promoted", measure(args.model, clean, store, promote_baseline=True)))
        for i in range(args.repeats):
            rows.append(row(f"clean repeat {i + 1}", measure(args.model, clean, store)))
        rows.append(row(f"fault {args.fault}", measure(args.model, slowed, store)))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("profile of the promoted run:")
    for p in rows[0]["profile"]:
        print(f"   {p['run']:<18} prefill {p['prefill_tokens_per_s']:>10.0f} tok/s   decode "
              f"{p['decode_ms_per_token']:>8.2f} ms/token")
    for r in rows[1:]:
        show(r)
    cleans = [r for r in rows[1:-1]]
    print(f"clean repeats passing: {sum(r['verdict'] == 'PASS' for r in cleans)} of "
          f"{len(cleans)}; fault {args.fault}: {rows[-1]['verdict']}")
    for kind in NAMES.values():
        lows = [s["low"] for r in cleans for s in r["slowdowns"] if s["kind"] == kind]
        faulty = [s["low"] for s in rows[-1]["slowdowns"] if s["kind"] == kind]
        if lows and faulty:
            print(f"{kind}: largest lower bound on clean repeats {max(lows):.2f}; with the "
                  f"fault, smallest {min(faulty):.2f} and largest {max(faulty):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
