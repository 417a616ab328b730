"""Fixed costs of a verdict, measured side by side in one run and given as ratios of the import
of the stack (torch + transformers + lm-eval), the cost every stage process used to pay again.

Run: .venv/bin/python bench/bench_verdict.py [--model tiny-llama] [--target cpu-bf16] [--real]

Prints, each a fresh process as a user runs it:
  * import    - `python -c "import torch, transformers, lm_eval"` (best of 3)
  * analyze   - `day0 analyze MODEL --json` (headers and config only)
  * validate  - `day0 validate MODEL` from an empty stage cache (cold) and again with
                `--no-cache` (nothing reused: every stage recomputed), each with its own
                temporary Prefect server as a first-time user gets
  * kept      - `day0 server start` (once), then `day0 validate MODEL --no-cache` attached to it
                twice: the first starts the stage host kept beside the server, the second forks
                from it (what a validation right after another costs when day0 keeps its server
                and host warm between commands)
  * per stage - report.json's seconds of each run, and the rest (server, flow, host)
With --real also SmolLM2-135M-Instruct (scripts/fetch_real_models.py) at default settings:
its verdict, wall time and each stage's seconds against its budget.
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
MODELS = ROOT / "tests" / "fixtures" / "models"


def timed(argv: list[str], env: dict, timeout: float = 3600) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    return time.perf_counter() - started, proc


def day0(*args, env: dict, timeout: float = 3600):
    return timed([sys.executable, "-m", "day0.cli", *map(str, args)], env, timeout)


def validate(model: Path, target: str, env: dict, out: Path, *extra: str) -> tuple[float, dict]:
    seconds, proc = day0("validate", model, "--target", target, "--out", out, *extra, env=env)
    if proc.returncode not in (0, 1):
        sys.exit(f"validate {model.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return seconds, json.loads((out / "report.json").read_text())


def stage_seconds(report: dict) -> dict[str, float]:
    return {name: float(s.get("seconds") or 0.0) for name, s in report["stages"].items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama", help="a fixture under tests/fixtures/models")
    parser.add_argument("--target", default="cpu-bf16")
    parser.add_argument("--real", action="store_true", help="also SmolLM2-135M at default settings")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="day0-bench-verdict-"))
    env = {**os.environ, "DAY0_CACHE_DIR": str(work / "cache"), "DAY0_SERVER_DIR": str(work / "server"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
    env.pop("PREFECT_API_URL", None)
    model = MODELS / args.model

    imports = [timed([sys.executable, "-c", "import torch, transformers, lm_eval"], env)[0]
               for _ in range(3)]
    base = min(imports)
    analyze_s, proc = day0("analyze", model, "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cold_s, cold = validate(model, args.target, env, work / "cold")
    nocache_s, again = validate(model, args.target, env, work / "again", "--no-cache")
    server_s, proc = day0("server", "start", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    try:
        kept_s, kept = validate(model, args.target, env, work / "kept", "--no-cache")
        warm_s, warm = validate(model, args.target, env, work / "warm", "--no-cache")
    finally:
        day0("server", "stop", env=env)

    rows = [("import torch+transformers+lm_eval (best of 3)", base),
            (f"day0 analyze {args.model}", analyze_s),
            (f"day0 validate {args.model} (cold)", cold_s),
            (f"day0 validate {args.model} --no-cache", nocache_s),
            ("day0 server start (once)", server_s),
            (f"day0 validate {args.model} --no-cache, kept server", kept_s),
            (f"day0 validate {args.model} --no-cache, kept server and host", warm_s)]
    print(f"{'what':58} {'seconds':>8} {'x import':>9}")
    for what, seconds in rows:
        print(f"{what:58} {seconds:8.1f} {seconds / base:9.2f}")
    print(f"verdicts: cold {cold['verdict']}, --no-cache {again['verdict']}, kept server "
          f"{kept['verdict']}, kept server and host {warm['verdict']}")
    for label, report, total in (("cold", cold, cold_s), ("--no-cache", again, nocache_s),
                                 ("kept server", kept, kept_s),
                                 ("kept server and host", warm, warm_s)):
        stages = stage_seconds(report)
        split = ", ".join(f"{k} {v:.1f}" for k, v in stages.items())
        print(f"{label} per stage (s): {split}; outside stages {total - sum(stages.values()):.1f}")

    if args.real:
        fetched = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_real_models.py")],
                                 capture_output=True, text=True, timeout=1800,
                                 env={k: v for k, v in env.items() if k != "DAY0_CACHE_DIR"})
        if fetched.returncode != 0:
            sys.exit(f"fetch_real_models.py failed:\n{fetched.stderr[-2000:]}")
        smollm2 = Path(fetched.stdout.strip().splitlines()[-1])
        real_s, real = validate(smollm2, args.target, env, work / "smollm2")
        print(f"SmolLM2-135M-Instruct default validate: {real['verdict']} in {real_s:.0f} s "
              f"({real_s / 60:.1f} min, {real_s / base:.0f}x import)")
        for name, stage in real["stages"].items():
            budget = stage.get("budget") or {}
            print(f"  {name:12} {float(stage.get('seconds') or 0):7.1f} s  ok={stage.get('ok')}"
                  f"  budget {budget.get('memory_gib', 0):.2f} GiB / {budget.get('timeout_s', 0):.0f} s"
                  f"  {stage.get('error') or ''}"[:180])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
