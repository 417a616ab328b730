"""`make demo` cold (empty day0 cache dir) vs warm (the same again), side by side in one run.

    python bench/bench_demo.py [--runs-warm 1] [--cmd "make demo"]

Both runs use one fresh DAY0_CACHE_DIR (stage cache, flow results and the demo's Prefect
database live there), so "cold" is a first run on this machine and "warm" a re-run where every
stage is a cache hit. Prints both wall times and warm/cold; the goal is under 40 %.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], env: dict, log: Path) -> tuple[float, int]:
    t0 = time.monotonic()
    with open(log, "wb") as out:
        code = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return time.monotonic() - t0, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cmd", default="make demo", help="what to time (default: make demo)")
    parser.add_argument("--runs-warm", type=int, default=1)
    args = parser.parse_args()
    cmd = shlex.split(args.cmd)
    with tempfile.TemporaryDirectory(prefix="day0-bench-demo-") as tmp:
        env = {**os.environ, "DAY0_CACHE_DIR": str(Path(tmp) / "cache")}
        env.pop("PREFECT_API_URL", None)  # the demo's own server, not one that happens to be set
        cold, code = timed(cmd, env, Path(tmp) / "cold.log")
        if code:
            print((Path(tmp) / "cold.log").read_text()[-3000:])
            print(f"cold run failed (exit {code})")
            return 1
        warm = []
        for i in range(args.runs_warm):
            seconds, code = timed(cmd, env, Path(tmp) / f"warm{i}.log")
            if code:
                print((Path(tmp) / f"warm{i}.log").read_text()[-3000:])
                print(f"warm run failed (exit {code})")
                return 1
            warm.append(seconds)
        summary = (Path(tmp) / "warm0.log").read_text().splitlines()[-4:]
    best = min(warm)
    print(f"{args.cmd}: cold {cold:.1f} s, warm {best:.1f} s "
          f"(of {len(warm)}: {', '.join(f'{w:.1f}' for w in warm)}), "
          f"warm/cold {best / cold:.0%}, worst {max(warm) / cold:.0%} (goal < 40 %)")
    print("warm run's last lines:\n  " + "\n  ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
