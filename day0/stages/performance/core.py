"""run(config, inputs): every workload's runs against inputs.endpoint through the load generator."""

from __future__ import annotations

import tempfile
from pathlib import Path

from day0 import progress
from day0.contract import StageInputs
from day0.engines import loadgen
from day0.stages.performance import baseline, compare
from day0.engines import workloads as wl
from day0.stages.performance.result import (LATENCIES, QUANTILES, Config, Request, Result,
                                            RunRow)

DEFINITIONS = ("vLLM's `vllm bench serve` (vllm.benchmarks.serve): TTFT = first token - sent; "
               "TPOT = (E2EL - TTFT) / (output tokens - 1); ITL = gaps between streamed "
               "chunks; E2EL = last token - sent; throughput over the run's wall time")


def selected(config: Config, file: wl.WorkloadFile) -> list[str]:
    return wl.pick(file, config.workloads or list(file.workloads), "performance.workloads")


def run(config: Config, inputs: StageInputs) -> Result:
    from day0.engines.process import engine_python

    engine = loadgen.served(inputs, "performance")
    endpoint, settings, folder, context = (engine.endpoint, engine.settings, engine.folder,
                                           engine.context)
    file = wl.load(config.workloads_file)
    names = selected(config, file)
    notes: list[str] = []
    runs = [r for name in names for r in wl.runs_for(name, file.workloads[name],
                                                      context=context, seed=config.seed,
                                                      notes=notes)]
    progress.plan({"runs": 1})
    finished = []

    def on_run(outcome: loadgen.RunOutcome) -> None:
        finished.append(outcome.id)
        progress.update("runs", len(finished), len(runs), detail=outcome.id)

    with tempfile.TemporaryDirectory(prefix="day0-load-") as tmp:
        outcomes, usage = loadgen.replay(runs, endpoint, tokenizer=str(folder),
                                         python=engine_python(settings), folder=Path(tmp),
                                         seed=config.seed, on_run=on_run)
    rows, requests = [], []
    by_id = {o.id: o for o in outcomes}
    for run_, outcome in ((r, by_id[r.id]) for r in runs):
        row, reqs = summarize(run_, outcome)
        row.baseline_key = baseline.run_key(run_, context)
        share = outcome.client_cores
        row.client_cpu_share = None if share is None else round(share, 3)
        row.client_bound = share is not None and share >= config.client_bound_share
        if row.client_bound:
            notes.append(f"{row.run}: the load generator kept {share:.2f} cores busy: its "
                         "figures may be client-bound (bench/bench_loadgen.py prints the "
                         "client's ceiling)")
        rows.append(row)
        requests += reqs
    result = Result(endpoint=endpoint.base_url, load_generator=next(
                        (o.client for o in outcomes if o.client), "vllm bench serve"),
                    definitions=DEFINITIONS, context=context, runs=rows, requests=requests,
                    client_wall_s=usage.wall_s, client_cpu_s=usage.cpu_s, notes=notes)
    against_baseline(result, config, inputs, names)
    return result


def against_baseline(result: Result, config: Config, inputs: StageInputs,
                     names: list[str]) -> None:
    """Compare with the stored baseline (gates of workloads without one: not applicable), then
    promote this run when asked."""
    where = baseline.location(config.baseline_store, inputs.source, inputs.revision,
                              inputs.target.name)
    result.baseline = where
    stored = baseline.load(where)
    runs = [r.model_dump(mode="json") for r in result.runs]
    requests = [r.model_dump(mode="json") for r in result.requests]
    if stored:
        result.baseline_promoted = stored.get("promoted")
        result.slowdowns, notes = compare.compare(
            runs, requests, stored, q=config.regression_quantile,
            confidence=config.regression_confidence, resamples=config.resamples,
            seed=config.seed, resolution_ms=config.resolution_ms,
            min_requests=config.min_requests)
        result.notes += notes
    how = ("promote one: `day0 validate --promote-baseline` or `day0 baseline promote "
           "RUN_FOLDER`")
    compared = {s.workload for s in result.slowdowns}
    why = f"no baseline of the same requests for {inputs.target.name} at {where} ({how})"
    for name in names:
        if name not in compared:
            result.inapplicable[f"performance.baseline.{name}"] = why
    if not compared:  # a gate over every workload ({workload}) has nothing to judge either
        result.inapplicable["performance.baseline"] = why
    if config.promote_baseline:
        entries = baseline.entries(runs, requests)
        if entries:
            result.promoted_to = baseline.save(where, entries,
                                               promoted_from=f"this run ({inputs.target.name})")
        skipped = [r["run"] for r in runs if r["run"] not in entries]
        if skipped:
            result.notes.append(f"not promoted (failed requests or no figures): "
                                f"{', '.join(skipped)}")


def summarize(run: loadgen.LoadRun, outcome: loadgen.RunOutcome) -> tuple[RunRow, list[Request]]:
    """A run's row (vLLM's aggregates) and its requests."""
    workload, level = run.id.rsplit("-", 1)
    row = RunRow(run=run.id, workload=workload, level=level, requests=len(run.trace))
    result = outcome.result
    if result is None:
        row.error = outcome.error or "no result"
        return row, []
    row.completed = int(result.get("completed") or 0)
    row.failed = int(result.get("failed") or len(run.trace) - row.completed)
    row.duration_s = result.get("duration")
    row.request_throughput = result.get("request_throughput")
    row.output_throughput = result.get("output_throughput")
    if run.goodput and result.get("request_goodput") is not None and row.request_throughput:
        row.goodput_fraction = result["request_goodput"] / row.request_throughput
    for lat in LATENCIES:
        for q in QUANTILES:
            setattr(row, f"{lat}_{q}_ms", result.get(f"{q}_{lat}_ms"))
    n = len(run.trace)
    col = {k: list(result.get(k) or [None] * n) for k in
           ("input_lens", "output_lens", "ttfts", "latencies", "itls", "start_times", "errors")}
    first = min((t for t in col["start_times"] if t is not None), default=0.0)
    requests = []
    for i, entry in enumerate(run.trace):
        error = col["errors"][i] if i < len(col["errors"]) else None
        out_tokens = col["output_lens"][i] if i < len(col["output_lens"]) else None
        in_tokens = col["input_lens"][i] if i < len(col["input_lens"]) else None
        ok = not error
        if ok and out_tokens == 0:
            row.empty += 1
        if ok and (in_tokens != entry.input_length or out_tokens != entry.output_length):
            row.length_mismatches += 1
        start = col["start_times"][i] if i < len(col["start_times"]) else None
        requests.append(Request(
            run=run.id, index=i, input_tokens=in_tokens, output_tokens=out_tokens,
            start_s=None if start is None else round(start - first, 4),
            ttft_ms=_ms(col["ttfts"][i] if ok else None),
            e2el_ms=_ms(col["latencies"][i] if ok else None),
            itl_ms=[round(x * 1000, 3) for x in (col["itls"][i] or [])] if ok else [],
            error=error or None))
    return row, requests


def _ms(seconds) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
