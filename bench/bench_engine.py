"""Time to verdict on an engine target vs the in-process target, split by phase, in one run.

    python bench/bench_engine.py [--model tests/fixtures/models/tiny-llama]
                                 [--engine-target vllm-cpu-bf16] [--torch-target cpu-bf16]

Runs `day0 validate --json --no-cache` on both targets, one after the other (same machine, same
fixture, an empty stage cache), and prints for each: total wall time, the engine's start
(launch mode: until the plain configuration answered /v1/models), and each stage's seconds
(smoke, api_alignment, serving with its variant launches; analysis, scan, alignment for the
in-process target), then the ratio of the two totals. Needs `make engine`.
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


def validate(model: str, target: str, env: dict) -> tuple[float, dict]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "day0.cli", "validate", model, "--target", target,
                           "--json", "--no-cache"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)
    seconds = time.monotonic() - started
    try:
        return seconds, json.loads(proc.stdout)
    except ValueError:
        sys.exit(f"{target}: exit {proc.returncode}\n{proc.stderr[-3000:]}")


def phases(report: dict) -> dict[str, float]:
    found = {}
    if report.get("engine") and report["engine"].get("ready_s") is not None:
        found["engine start"] = report["engine"]["ready_s"]
    for name, stage in report["stages"].items():
        found[name] = stage["seconds"]
    serving = report.get("evidence", {}).get("serving") or {}
    for row in serving.get("variants", []):
        if row.get("ready_s") is not None:
            found[f"  serving: variant {row.get('name')} start"] = row["ready_s"]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "tests/fixtures/models/tiny-llama"))
    parser.add_argument("--engine-target", default="vllm-cpu-bf16")
    parser.add_argument("--torch-target", default="cpu-bf16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="day0-bench-engine-") as tmp:
        env = {**os.environ, "DAY0_CACHE_DIR": str(Path(tmp) / "cache")}
        env.pop("PREFECT_API_URL", None)
        results = {target: validate(args.model, target, env)
                   for target in (args.engine_target, args.torch_target)}
    rows: dict[str, dict[str, float]] = {t: phases(r) for t, (_, r) in results.items()}
    names = list(dict.fromkeys(n for r in rows.values() for n in r))
    width = max(len(n) for n in names + ["phase"])
    print(f"{'phase':<{width}}  " + "  ".join(f"{t:>16}" for t in results))
    for name in names:
        print(f"{name:<{width}}  " + "  ".join(
            f"{rows[t][name]:>15.1f}s" if name in rows[t] else f"{'-':>16}" for t in results))
    print(f"{'total (wall)':<{width}}  " + "  ".join(f"{s:>15.1f}s" for s, _ in results.values()))
    print(f"{'verdict':<{width}}  " + "  ".join(f"{r['verdict']:>16}" for _, r in results.values()))
    (engine_s, _), (torch_s, _) = results.values()
    print(f"engine target / in-process target: {engine_s / torch_s:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
