"""Operator scan of full-size real configs: wall time, peak RSS, ops found.

Run: ``.venv/bin/python bench/bench_scan.py [--target cpu-bf16] [--no-probe] [--seq-len 32]
[--configs DeepSeek-V3 Llama-3.1-8B Mixtral-8x7B-v0.1]``

Each scan runs in its own subprocess (a fresh interpreter, as the stage runner does), so its
peak RSS is its own: the child reports its ``VmHWM`` (``day0.execution.memory.peak_rss_bytes``), the
parent also reads ``RUSAGE_CHILDREN`` (the largest child so far) as a cross-check. Wall time includes starting
Python and importing torch/transformers; ``stage s`` is the scan alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
DEFAULT = ["DeepSeek-V3", "Llama-3.1-8B", "Mixtral-8x7B-v0.1"]

CHILD = """
import json, sys
from day0.execution import memory
from day0.stages.scan import core as scan
from day0.execution.contract import StageInputs
from day0.execution.targets import resolve_target
r = scan.run(scan.Config(seq_len=int(sys.argv[3]), probe=sys.argv[4] == "1"),
             StageInputs(source=sys.argv[1], target=resolve_target(sys.argv[2])))
print(json.dumps({"stage_s": r.seconds, "rss": memory.peak_rss_bytes(), "ops": len(r.ops),
                  "long_tail": r.long_tail, "coverage": r.coverage, "uncovered": r.uncovered, "unprobed": r.unprobed, "params": r.params,
                  "error": r.scan_error}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cpu-bf16")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--no-probe", action="store_true")
    parser.add_argument("--configs", nargs="+", default=DEFAULT)
    args = parser.parse_args()
    print(f"{'config':<20} {'params':>8} {'wall s':>7} {'stage s':>8} {'peak RSS':>9} {'ops':>4} "
          f"{'coverage':>8}  long-tail")
    for name in args.configs:
        path = CONFIGS / f"{name}.json"
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, str(path), args.target,
                               str(args.seq_len), "0" if args.no_probe else "1"],
                              capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            print(f"{name:<20} FAILED: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        cov = "n/a" if r["coverage"] is None else f"{r['coverage']:.1%}"
        print(f"{name:<20} {r['params'] / 1e9:>7.1f}B {wall:>7.1f} {r['stage_s']:>8.1f} "
              f"{r['rss'] / 2**30:>7.2f}Gi {r['ops']:>4} {cov:>8}  {', '.join(r['long_tail'])}")
        for key in ("uncovered", "unprobed"):
            if r[key] and r["coverage"] is not None:
                print(f"{'':<20} {key}: {', '.join(r[key])}")
        if r["error"]:
            print(f"{'':<20} scan stopped early: {r['error']}")
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(f"largest child peak RSS (RUSAGE_CHILDREN): {children / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
