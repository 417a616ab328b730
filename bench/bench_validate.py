"""Time to verdict per fixture (what `make demo` does) and a warm-cache repeat as a ratio of the first.

Run: .venv/bin/python bench/bench_validate.py [--target cpu-bf16] [--models tiny-llama tiny-qwen3moe]

Each validation is a real `day0 validate` CLI process with its own temporary Prefect server, like
`make demo`. The first run starts from an empty stage cache; the second reuses it (same weights,
target, stage config and code), so the ratio shows what caching saves end to end.
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


def validate(model: str, target: str, cache_dir: str, out: Path) -> tuple[float, dict]:
    env = {**os.environ, "DAY0_CACHE_DIR": cache_dir, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)  # a temporary server per run, as in `make demo`
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "day0.cli", "validate", str(ROOT / "tests/fixtures/models" / model),
                           "--target", target, "--text", str(ROOT / "tests/fixtures/text/heldout.txt"),
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=1800)
    seconds = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"validate {model} failed with exit {proc.returncode}:\n{proc.stderr[-3000:]}")
    return seconds, json.loads((out / "report.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cpu-bf16")
    parser.add_argument("--models", nargs="+", default=["tiny-llama", "tiny-qwen3moe", "tiny-deepseekv3"])
    args = parser.parse_args()
    print(f"{'model':<16} {'run':<5} {'wall_s':>8} {'stages_s':>9} {'cached':>7} verdict")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            cache_dir = str(Path(tmp) / f"cache-{model}")
            walls = []
            for run in ("cold", "warm"):
                wall, report = validate(model, args.target, cache_dir, Path(tmp) / f"{model}-{run}")
                stage_s = sum(s["seconds"] for s in report["stages"].values() if not s["cached"])
                cached = sum(s["cached"] for s in report["stages"].values())
                walls.append(wall)
                print(f"{model:<16} {run:<5} {wall:8.1f} {stage_s:9.1f} {cached:>4}/{len(report['stages'])}  {report['verdict']}")
            print(f"{model:<16} warm/cold wall-clock ratio: {walls[1] / walls[0]:.2f}")


if __name__ == "__main__":
    main()
