#!/usr/bin/env python
"""Every causal-LM architecture transformers ships, through day0: a tiny random checkpoint of
each model type (day0.torchkit.tiny), then `day0 analyze`, `day0 scan` and `day0 validate
--bring-up --stages analysis,scan,alignment` on it, each a subprocess with a time limit.

    python bench/sweep_architectures.py                       # all model types
    python bench/sweep_architectures.py --types llama,mamba2 --limit-s 60
    python bench/sweep_architectures.py --write-docs          # regenerate docs/architectures.md
    python bench/sweep_architectures.py --types gemma3,llama4 --merge --write-docs
                                    # rerun some types: their rows replace those of RESULTS below

What is checked per type: analysis' params.total equals the element count of the saved
tensors (safetensors headers); scan records ops; validate reaches a verdict (exit 0, 1, 3 or
5), never exit 4 (internal error) nor a traceback. Results go to OUT/results.json and a
markdown table (OUT/architectures.md, or docs/architectures.md with --write-docs).
One kept Prefect server (`day0 server start`) serves every validate; cache and server state
live under OUT, never the user's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOKENIZER = ROOT / "tests" / "fixtures" / "models" / "tiny-llama"
DOCS_PAGE = ROOT / "docs" / "architectures.md"
RESULTS = ROOT / "bench" / "sweep_results.json"  # the docs table's rows, kept with it
STAGES = "analysis,scan,alignment"
TARGET = "cpu-bf16"
from bench.sweep_table import EXIT_NAMES, REACHED, write_table  # noqa: E402

BUILD_LOCK = threading.Lock()  # building seeds torch and toggles transformers' logging: one at a time


def run(args: list[str], env: dict, limit_s: float) -> dict:
    """A day0 CLI subprocess: exit code, stdout, stderr, seconds; exit None on the time limit."""
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "day0.cli", *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=limit_s)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, _text(exc.stdout), _text(exc.stderr)
    return {"rc": rc, "out": out, "err": err, "s": round(time.monotonic() - started, 1)}


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value or ""


def bug_of(name: str, result: dict) -> str | None:
    """An exit 4 or a traceback is day0's bug: its last stderr line names it."""
    if result["rc"] == 4 or "Traceback (most recent call last)" in result["err"]:
        lines = [line for line in result["err"].splitlines() if line.strip()]
        return f"{name}: exit {result['rc']}: {lines[-1].strip()[:200] if lines else '?'}"
    return None


def last_json(text: str) -> dict | None:
    """The JSON document a --json command printed (its stdout may carry log lines first)."""
    start = text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        return None


def sweep_one(model_type: str, out: Path, env: dict, limit_s: float, dtype: str) -> dict:
    from day0.torchkit.tiny import Unbuildable, build_tiny, causal_lm_types, first_line

    row = {"type": model_type, "class": causal_lm_types().get(model_type), "bugs": []}
    started = time.monotonic()
    folder = out / "checkpoints" / model_type
    try:
        with BUILD_LOCK:
            tiny = build_tiny(model_type, folder, tokenizer_from=TOKENIZER, dtype=dtype)
    except Unbuildable as exc:
        return {**row, "skipped": str(exc), "s": round(time.monotonic() - started, 1)}
    except Exception as exc:  # the builder's own bug: one row, never the whole sweep
        return {**row, "skipped": f"builder crashed: {first_line(exc)}",
                "s": round(time.monotonic() - started, 1)}
    row["tensors"] = tiny.tensor_elements
    _analyze(row, folder, env, limit_s)
    _scan(row, folder, env, limit_s)
    _validate(row, folder, out / "reports" / model_type, env, limit_s)
    row["s"] = round(time.monotonic() - started, 1)
    shutil.rmtree(folder, ignore_errors=True)  # a few MB each, but 150 of them
    return row


def _analyze(row: dict, folder: Path, env: dict, limit_s: float) -> None:
    result = run(["analyze", str(folder), "--json"], env, limit_s)
    row["analyze_rc"] = result["rc"]
    doc = last_json(result["out"]) if result["rc"] == 0 else None
    params = (doc or {}).get("params") or {}
    total = params.get("total")
    row["analyze_total"] = total
    # the saved tensors are the parameters plus persistent buffers (reported apart)
    row["exact"] = (total + (params.get("buffers") or 0) == row["tensors"]
                    if total is not None else None)
    if doc is None:
        row["analyze_error"] = _why(result)
    if bug := bug_of("analyze", result):
        row["bugs"].append(bug)


def _scan(row: dict, folder: Path, env: dict, limit_s: float) -> None:
    result = run(["scan", str(folder), "--target", TARGET, "--json"], env, limit_s)
    row["scan_rc"] = result["rc"]
    doc = last_json(result["out"]) if result["rc"] in (0, 1) else None
    row["scan_ops"] = len(doc["ops"]) if doc and isinstance(doc.get("ops"), list) else None
    row["scan_error"] = (doc or {}).get("scan_error") or (None if doc else _why(result))
    if bug := bug_of("scan", result):
        row["bugs"].append(bug)


def sweep_gates(out: Path) -> Path:
    """The shipped gates of the stages the sweep runs: the verdict judges what ran (every other
    stage's gates would be 'not evaluated: not selected', a FAIL by design)."""
    import yaml

    shipped = yaml.safe_load((ROOT / "gates.yaml").read_text())
    ran = set(STAGES.split(","))
    shipped["gates"] = [g for g in shipped["gates"] if g["metric"].split(".")[0] in ran]
    path = out / "gates-sweep.yaml"
    path.write_text(yaml.safe_dump(shipped, sort_keys=False))
    # 8 greedy tokens per prompt, not 32: generation is most of a tiny MoE's alignment time on
    # CPU, and the sweep asks whether each architecture runs and aligns, not how long it agrees
    (out / "sweep-config.yaml").write_text(yaml.safe_dump({"alignment": {"new_tokens": 8}}))
    return path


def _validate(row: dict, folder: Path, report_dir: Path, env: dict, limit_s: float) -> None:
    work = Path(env["DAY0_CACHE_DIR"]).parent
    result = run(["validate", str(folder), "--target", TARGET, "--bring-up", "--stages", STAGES,
                  "--gates", str(work / "gates-sweep.yaml"), "--config",
                  str(work / "sweep-config.yaml"), "--out", str(report_dir)], env, limit_s)
    row["validate_rc"], row["validate_s"] = result["rc"], result["s"]
    report = report_dir / "report.json"
    doc = json.loads(report.read_text()) if report.is_file() else {}
    row["verdict"] = doc.get("verdict")
    failing = [g for g in doc.get("gates") or [] if g.get("applicable") and not g.get("passed")]
    # --stages leaves the other stages' gates "not evaluated": only the run stages' count here
    ran = [g for g in failing if "not selected" not in str(g.get("not_evaluated") or "")]
    row["failed_gates"] = [g["id"] for g in ran]
    row["stage_errors"] = {name: (s.get("failure") or s.get("error"))
                           for name, s in (doc.get("stages") or {}).items()
                           if isinstance(s, dict) and not s.get("ok")}
    if result["rc"] not in REACHED:
        row["validate_error"] = _why(result)
    if bug := bug_of("validate", result):
        row["bugs"].append(bug)


def _why(result: dict) -> str:
    if result["rc"] is None:
        return f"time limit ({result['s']:.0f} s)"
    lines = [line.strip() for line in result["err"].splitlines() if line.strip()]
    return f"exit {result['rc']}: {lines[-1][:160] if lines else 'no stderr'}"


def environment(out: Path) -> dict:
    env = dict(os.environ)
    env.update(DAY0_CACHE_DIR=str(out / "cache"), DAY0_SERVER_DIR=str(out / "server"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
               HF_HUB_OFFLINE="1", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               TOKENIZERS_PARALLELISM="false")
    env.pop("PREFECT_API_URL", None)  # the kept server below, never a user's
    return env


def main(argv: list[str] | None = None) -> int:
    from day0.torchkit.tiny import causal_lm_types

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", help="comma-separated model types (default: all)")
    parser.add_argument("--limit-s", type=float, default=120.0,
                        help="time limit of each day0 command (default 120)")
    parser.add_argument("--jobs", type=int, default=1, help="model types at once (default 1)")
    parser.add_argument("--out", type=Path, help="work folder (default: a new temporary one)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--write-docs", action="store_true",
                        help=f"write the table to {DOCS_PAGE.relative_to(ROOT)}")
    parser.add_argument("--from-results", type=Path, metavar="RESULTS_JSON",
                        help="only write the table from an earlier (even unfinished) run")
    parser.add_argument("--merge", action="store_true",
                        help=f"rows of the types run replace theirs in "
                             f"{RESULTS.relative_to(ROOT)}, which then holds the merged rows")
    args = parser.parse_args(argv)
    known = causal_lm_types()
    if args.from_results:
        rows, meta = _load(args.from_results, args)
    else:
        types = args.types.split(",") if args.types else list(known)
        if unknown := [t for t in types if t not in known]:
            parser.error(f"not causal-LM model types: {', '.join(unknown)}")
        out = (args.out or Path(tempfile.mkdtemp(prefix="day0-sweep-"))).resolve()
        out.mkdir(parents=True, exist_ok=True)
        meta = {"jobs": args.jobs, "limit_s": args.limit_s, "dtype": args.dtype,
                "cpus": os.cpu_count(), "machine": platform.machine(),
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        rows = sweep(types, out, args, meta)
        args.from_results = out / "results.json"
    if args.merge:
        rows, meta = merged(rows, meta)
    meta.update(types_run=len(rows), types_known=len(known))
    if args.write_docs or args.merge:
        RESULTS.write_text(json.dumps({"meta": meta, "rows": sorted(rows, key=lambda r: r["type"])},
                                      indent=1) + "\n")
    page = DOCS_PAGE if args.write_docs else args.from_results.parent / "architectures.md"
    summary = write_table(sorted(rows, key=lambda r: r["type"]), page, meta)
    print(f"\n{summary}\ntable: {page}\nresults: {args.from_results}")
    return 0


def sweep(types: list[str], out: Path, args, meta: dict) -> list[dict]:
    """Every type through day0 on one kept server; results.json rewritten after each."""
    env = environment(out)
    sweep_gates(out)
    started = time.monotonic()
    server = run(["server", "start", "--idle-minutes", "30"], env, 300)
    print(f"server: exit {server['rc']} ({server['s']} s); work folder {out}", flush=True)
    rows: list[dict] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = [pool.submit(sweep_one, t, out, env, args.limit_s, args.dtype)
                       for t in types]
            for i, future in enumerate(concurrent.futures.as_completed(futures), 1):
                rows.append(future.result())
                meta["seconds"] = round(time.monotonic() - started)
                # an interrupted sweep still leaves its table's material (--from-results)
                (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                             indent=1))
                print(f"[{i}/{len(types)}] {progress(rows[-1])}", flush=True)
    finally:
        run(["server", "stop"], env, 120)
    return rows


def merged(rows: list[dict], meta: dict) -> tuple[list[dict], dict]:
    """The kept rows with those just run in their place; the header keeps the full sweep's
    settings and counts the types run again since."""
    kept = json.loads(RESULTS.read_text())
    again = {r["type"] for r in rows}
    kept_meta = kept["meta"]
    kept_meta["rerun_types"] = sorted(again | set(kept_meta.get("rerun_types", [])))
    return [r for r in kept["rows"] if r["type"] not in again] + rows, kept_meta


def _load(path: Path, args) -> tuple[list[dict], dict]:
    doc = json.loads(path.read_text())
    if isinstance(doc, list):  # rows only
        doc = {"rows": doc, "meta": {"jobs": args.jobs, "limit_s": args.limit_s,
                                     "dtype": args.dtype, "cpus": os.cpu_count(),
                                     "seconds": round(path.stat().st_mtime - path.parent.stat().st_ctime)}}
    return doc["rows"], doc["meta"]


def progress(row: dict) -> str:
    if "skipped" in row:
        return f"{row['type']}: skipped ({row['skipped']})"
    verdict = EXIT_NAMES.get(row.get("validate_rc"), row.get("validate_error"))
    bugs = f"; BUG {row['bugs'][0]}" if row["bugs"] else ""
    return (f"{row['type']}: exact={row.get('exact')} ops={row.get('scan_ops')} "
            f"validate={verdict} ({row['s']} s){bugs}")


if __name__ == "__main__":
    sys.exit(main())
