"""vLLM's benchmark client (``vllm bench serve``) for day0's load runs, inside the engine venv.

day0 generates no traffic itself. Every run of a plan is one ``vllm bench serve`` invocation:
its argv is parsed by vLLM's own parser and executed by vLLM's own ``main`` (its request
functions, its metric definitions), all runs in one process so the client imports once. After
each run one JSON line (the run's id and vLLM's detailed result) is appended to the output and
flushed: a SIGTERM or a timeout loses only the run in flight.

Usage: ``python vllm_bench_driver.py PLAN.json OUT.jsonl``;
PLAN is ``{"runs": [{"id": "short_qa-c4", "argv": ["--backend", "vllm", ...]}]}``; a run with
``"repeat_until": UNIX_TIME`` is repeated as windows ``<id>-w0001``, ... until that time (a soak).
Run by the engine's interpreter: imports vLLM, never day0 (the engine venv has no day0).
"""

from __future__ import annotations

import json
import math
import sys
import time


def _finite(value):
    """JSON without NaN/inf (vLLM leaves inf in some aggregates when nothing completed)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def main(argv: list[str]) -> int:
    plan_path, out_path = argv
    with open(plan_path) as f:
        plan = json.load(f)
    import vllm
    from vllm.benchmarks.serve import add_cli_args, main as bench
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    client = f"vllm bench serve {getattr(vllm, '__version__', '(version unknown)')}"

    for run in plan["runs"]:
        # a soak repeats its run as windows <id>-w0001, -w0002, ... until repeat_until
        until = run.get("repeat_until")
        window = 0
        while True:
            window += 1
            run_id = f"{run['id']}-w{window:04d}" if until else run["id"]
            _one(run_id, run["argv"], client, out_path, bench, add_cli_args,
                 FlexibleArgumentParser)
            if not until or time.time() >= until:
                break
    return 0


def _one(run_id, argv, client, out_path, bench, add_cli_args, parser_class) -> None:
    parser = parser_class(prog="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    started, cpu = time.time(), time.process_time()
    try:
        line = {"id": run_id, "client": client, "started": started,
                "result": _finite(bench(args))}
    except Exception as exc:  # the run's own failure; later runs still run
        line = {"id": run_id, "client": client, "started": started,
                "error": f"{type(exc).__name__}: {exc}"}
    line["ended"] = time.time()
    # the client's own CPU while it ran this run (all its threads): near 1 core = client-bound
    line["client_cpu_s"] = time.process_time() - cpu
    with open(out_path, "a") as out:
        out.write(json.dumps(line) + "\n")
        out.flush()
    print(f"day0-loadgen: finished {run_id}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
