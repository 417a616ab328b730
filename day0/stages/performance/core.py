"""run(config, inputs): every workload's runs against inputs.endpoint through the load generator."""

from __future__ import annotations

import tempfile
from pathlib import Path

from day0.execution import progress
from day0.execution.contract import StageInputs
from day0.engines import loadgen
from day0.stages.performance import baseline, compare, kernel
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

    file = wl.load(config.workloads_file)
    names = selected(config, file)
    notes: list[str] = []
    if inputs.target.kind != "engine":
        return profiled(config, inputs, file, names, notes)
    engine = loadgen.served(inputs, "performance")
    endpoint, settings, folder, context = (engine.endpoint, engine.settings, engine.folder,
                                           engine.context)
    runs = [r for name in names for r in wl.runs_for(name, file.workloads[name],
                                                      context=context, seed=config.seed,
                                                      notes=notes)]
    for r in runs:
        r.warmups = config.warmups_per_slot * (r.concurrency or 1)
    progress.plan({"runs": 1})
    finished, planned = [], [len(runs)]
    python = engine_python(settings)

    def on_run(outcome: loadgen.RunOutcome) -> None:
        finished.append(outcome.id)
        progress.update("runs", len(finished), planned[0], detail=outcome.id)

    def measure(batch: list[loadgen.LoadRun], notes: list[str]):
        with tempfile.TemporaryDirectory(prefix="day0-load-") as tmp:
            outcomes, usage = loadgen.replay(batch, endpoint, tokenizer=str(folder),
                                             python=python, folder=Path(tmp),
                                             seed=config.seed, on_run=on_run)
        return tabulate(batch, outcomes, context, config, notes), outcomes, usage

    def remeasure(ids: list[str]) -> tuple[list[RunRow], list[Request]]:
        planned[0] += len(ids)
        return measure([r for r in runs if r.id in ids], [])[0]

    (rows, requests), outcomes, usage = measure(runs, notes)
    result = Result(endpoint=endpoint.base_url, load_generator=next(
                        (o.client for o in outcomes if o.client), "vllm bench serve"),
                    definitions=DEFINITIONS, context=context, runs=rows, requests=requests,
                    client_wall_s=usage.wall_s, client_cpu_s=usage.cpu_s, notes=notes)
    against_baseline(result, config, inputs, names, remeasure)
    for kind in ("prefill", "decode"):
        result.inapplicable[f"performance.baseline.{{workload}}.{kind}_slowdown"] = (
            "kernel-profile gate: device (in-process) targets only")
    return result


def profiled(config: Config, inputs: StageInputs, file: wl.WorkloadFile, names: list[str],
             notes: list[str]) -> Result:
    """A device (in-process) target: the kernel profile of every workload, compared with its
    baseline like load runs are."""
    measure, context = kernel.prepare(config, inputs, file, names, notes)
    rows, records = measure()
    result = Result(endpoint="in-process", load_generator="day0 kernel profile (PyTorch "
                    f"{inputs.target.device}/{inputs.target.dtype})",
                    definitions=kernel.DEFINITIONS, context=context, runs=rows, requests=records,
                    notes=notes)
    # every repeat is one figure: a profile is compared with kernel_repeats of them a side; its
    # gated kinds are prefill (ttft) and decode (tpot), confirmed below their gates' threshold
    against_baseline(result, config, inputs, names, measure, min_requests=2,
                     confirm_kinds=("ttft", "tpot"), confirm_above=config.kernel_confirm_above)
    why = "served-request gate: engine targets only (a device target gets a kernel profile)"
    served = [f"{{workload}}.{lat}_{q}_ms" for lat in LATENCIES for q in QUANTILES]
    served += ["{workload}.goodput_fraction", "{workload}.request_throughput",
               "{workload}.output_throughput"]
    served += [f"baseline.{{workload}}.{kind}_slowdown" for kind in compare.KINDS]
    for metric in served:
        result.inapplicable[f"performance.{metric}"] = why
    return result


def tabulate(runs: list[loadgen.LoadRun], outcomes: list[loadgen.RunOutcome], context: int,
             config: Config, notes: list[str]) -> tuple[list[RunRow], list[Request]]:
    """Each run's row and requests, in plan order; client-bound runs flagged with a note."""
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
    return rows, requests


def against_baseline(result: Result, config: Config, inputs: StageInputs,
                     names: list[str], remeasure=None, min_requests: int | None = None,
                     confirm_kinds: tuple[str, ...] | None = None,
                     confirm_above: float | None = None) -> None:
    """Compare with the stored baseline (runs that look slower measured again when remeasure is
    given; gates of workloads without a baseline: not applicable), then promote this run when
    asked."""
    where = baseline.location(config.baseline_store, inputs.source, inputs.revision,
                              inputs.target.name)
    result.baseline = where
    stored = baseline.load(where, log=lambda line: print(f"baseline {where}: {line}", flush=True))
    runs = [r.model_dump(mode="json") for r in result.runs]
    requests = [r.model_dump(mode="json") for r in result.requests]
    if stored:
        result.baseline_promoted = stored.get("promoted")
        result.slowdowns, notes = compare.compare(
            runs, requests, stored, q=config.regression_quantile,
            confidence=config.regression_confidence, resamples=config.resamples,
            seed=config.seed, resolution_ms=config.resolution_ms,
            min_requests=min_requests or config.min_requests)
        result.notes += notes
        if remeasure is not None:
            confirm(result, stored, config, remeasure, min_requests,
                    kinds=set(confirm_kinds or ()), above=confirm_above)
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


def confirm(result: Result, stored: dict, config: Config, remeasure,
            min_requests: int | None = None, kinds: set[str] | None = None,
            above: float | None = None) -> None:
    """Measure again every run whose slowdown lower bound (of the kinds; config.confirm_kinds)
    exceeds above (config.confirm_above); per run the attempt with the smaller largest lower
    bound is kept (rows, requests, slowdowns)."""
    kinds = kinds or set(config.confirm_kinds)
    above = above or config.confirm_above
    for _ in range(config.confirm_attempts):
        suspects = sorted({s.run for s in result.slowdowns if s.kind in kinds
                           and s.low is not None and s.low > above})
        if not suspects:
            return
        rows, requests = remeasure(suspects)
        again, _ = compare.compare(
            [r.model_dump(mode="json") for r in rows],
            [r.model_dump(mode="json") for r in requests], stored,
            q=config.regression_quantile, confidence=config.regression_confidence,
            resamples=config.resamples, seed=config.seed, resolution_ms=config.resolution_ms,
            min_requests=min_requests or config.min_requests)
        for run_id in suspects:
            before, after = _worst(result.slowdowns, run_id, kinds), _worst(again, run_id, kinds)
            tried = result.attempts.setdefault(run_id, [before])
            tried.append(after)
            kept = after is not None and after < before
            counted = 1 + min((i for i, x in enumerate(tried) if x is not None),
                              key=lambda i: tried[i])
            result.notes.append(
                f"{run_id}: slower than its baseline (lower bound {before:.2f}x), measured "
                f"again: {'no figures' if after is None else f'{after:.2f}x'}; attempt "
                f"{counted} of {len(tried)} counts (the least slow: a regression must "
                "reproduce)")
            if kept:
                result.runs = [next(r for r in rows if r.run == run_id) if r.run == run_id
                               else r for r in result.runs]
                result.requests = ([r for r in result.requests if r.run != run_id]
                                   + [r for r in requests if r.run == run_id])
                result.slowdowns = ([s for s in result.slowdowns if s.run != run_id]
                                    + [s for s in again if s.run == run_id])


def _worst(slowdowns: list[compare.Slowdown], run_id: str, kinds: set[str]) -> float | None:
    lows = [s.low for s in slowdowns if s.run == run_id and s.kind in kinds
            and s.low is not None]
    return max(lows) if lows else None


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
