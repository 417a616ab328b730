"""run(config, inputs): sustained load on inputs.endpoint, the engine watched throughout."""

from __future__ import annotations

import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from day0.execution import progress
from day0.execution.contract import StageInputs
from day0.engines import loadgen, procmem
from day0.engines import workloads as wl
from day0.engines.client import EngineClient, EngineError
from day0.stages.soak import checks
from day0.stages.soak.result import Config, Result, Sample, Window
from day0.stages.soak.trend import trend


class Sampler(threading.Thread):
    """Samples the engine's memory and KV-cache usage every interval until stopped."""

    def __init__(self, root, client: EngineClient, interval_s: float, start: float):
        super().__init__(daemon=True)
        self.root, self.client, self.interval_s, self.start_at = root, client, interval_s, start
        self.samples: list[Sample] = []
        self.halt = threading.Event()

    def sample(self) -> Sample:
        rss, uss = procmem.tree_memory(self.root) if self.root else (None, None)
        try:
            metrics = self.client.metrics()
            kv = metrics.get("vllm:kv_cache_usage_perc", metrics.get("vllm:gpu_cache_usage_perc"))
        except EngineError:
            kv = None
        return Sample(t_s=round(time.time() - self.start_at, 3), rss_mb=rss, uss_mb=uss,
                      kv_usage=kv)

    def run(self) -> None:
        while not self.halt.is_set():
            self.samples.append(self.sample())
            self.halt.wait(self.interval_s)


def window_row(outcome: loadgen.RunOutcome, start: float) -> Window:
    result = outcome.result or {}
    begin = (outcome.started or start) - start
    end = (outcome.ended or time.time()) - start
    lens = result.get("output_lens") or []
    errors = result.get("errors") or []
    empty = sum(1 for i, n in enumerate(lens) if n == 0 and not (i < len(errors) and errors[i]))
    return Window(window=outcome.id, start_s=round(begin, 3), end_s=round(end, 3),
                  requests=int(result.get("completed", 0)) + int(result.get("failed", 0)),
                  failed=int(result.get("failed", 0)), empty=empty,
                  ttft_p50_ms=result.get("p50_ttft_ms"), ttft_p99_ms=result.get("p99_ttft_ms"),
                  e2el_p50_ms=result.get("p50_e2el_ms"),
                  tpot_p50_ms=result.get("p50_tpot_ms"), e2el_p99_ms=result.get("p99_e2el_ms"),
                  output_throughput=result.get("output_throughput"), error=outcome.error)


@dataclass
class Sustained:
    """What the sustained load left: its windows, the engine's samples, the load runs'
    outcomes, and why it stopped early (a SIGTERM), if it did."""

    windows: list[Window]
    samples: list[Sample]
    outcomes: list[loadgen.RunOutcome]
    stopped: str | None


def run(config: Config, inputs: StageInputs) -> Result:
    from day0.torchkit.evaltext import load_tokenizer

    engine = loadgen.served(inputs, "soak")
    endpoint, settings, folder, context = (engine.endpoint, engine.settings, engine.folder,
                                           engine.context)
    tokenizer = load_tokenizer(str(folder), trust_remote_code=inputs.trust_remote_code)
    file = wl.load(config.workloads_file)
    [name] = wl.pick(file, [config.workload], "soak.workload")
    workload = file.workloads[name]
    concurrency = config.concurrency or max(workload.arrival.concurrency or [4])
    notes: list[str] = []
    trace = wl.trace_for(config.workload, workload, context=context, seed=config.seed,
                         notes=notes)
    planned = config.duration_s
    client = EngineClient.of(endpoint, timeout_s=settings.request_timeout_s)
    prompts = checks.probe_prompts(tokenizer, config.probes)
    before = checks.generate(client, endpoint.served_name, prompts, config.probe_tokens)
    bounds = (checks.boundaries(client, endpoint.served_name, context, prompts[0][0])
              if config.boundaries else [])
    root = procmem.engine_root(endpoint)
    source = (f"engine process tree (pid {root.pid} and its children)" if root else
              "none: the engine has no process on this machine (KV-cache usage only)")
    repeated = loadgen.LoadRun(id="soak", trace=trace, concurrency=concurrency,
                               max_duration_s=workload.max_duration_s)
    load = sustain_load(config, client, root, repeated, endpoint, settings, tokenizer=str(folder))
    elapsed = max((w.end_s for w in load.windows), default=0.0)
    interrupted = load.stopped
    if interrupted is None and elapsed < planned:
        interrupted = (f"the load stopped after {elapsed:.0f} s of {planned:.0f} s: "
                       + "; ".join(o.error for o in load.outcomes if o.error)[:300])
    healthy = client.healthy()
    if load.stopped:
        after = [None] * len(before)
        notes.append("probes after the soak not run: interrupted")
    else:
        after = checks.generate(client, endpoint.served_name, prompts, config.probe_tokens) \
            if healthy else [None] * len(before)
    client.close()
    result = Result(endpoint=endpoint.base_url,
                    load_generator=next((o.client for o in load.outcomes if o.client),
                                        "vllm bench serve"),
                    workload=config.workload, concurrency=concurrency, planned_s=planned,
                    elapsed_s=round(elapsed, 3), interrupted=interrupted, windows=load.windows,
                    samples=load.samples, memory_source=source, boundaries=bounds,
                    probes=[] if load.stopped else checks.compare_probes(before, after),
                    healthy_after=healthy, notes=notes)
    add_trends(result, config)
    return result


def sustain_load(config: Config, client: EngineClient, root, run_: loadgen.LoadRun, endpoint,
                 settings, *, tokenizer: str) -> Sustained:
    """Repeat run_ until config.duration_s has passed from its start (or a SIGTERM), the
    engine sampled throughout and each finished window reported as progress."""
    from day0.engines.process import engine_python

    planned = config.duration_s
    stopping: list[str] = []

    def on_term(signum, frame):  # keep what was measured: stop the load, report, exit
        stopping.append(f"SIGTERM after {time.time() - started:.0f} s of {planned:.0f} s")

    started = time.time()
    previous = (signal.signal(signal.SIGTERM, on_term)
                if threading.current_thread() is threading.main_thread() else None)
    sampler = Sampler(root, client, config.sample_interval_s, started)
    sampler.start()
    windows: list[Window] = []
    progress.plan({"soak": 1})

    def on_window(outcome: loadgen.RunOutcome) -> None:
        windows.append(window_row(outcome, started))
        last = sampler.samples[-1] if sampler.samples else None
        w = windows[-1]
        progress.update("soak", min(time.time() - started, planned), planned, detail=(
            f"{w.window}: p99 TTFT {w.ttft_p99_ms or 0:.0f} ms, "
            f"{w.output_throughput or 0:.0f} tok/s, RSS "
            f"{(last.rss_mb or 0) if last else 0:.0f} MiB"))

    run_ = run_.model_copy(update={"repeat_until": started + planned})
    try:
        with tempfile.TemporaryDirectory(prefix="day0-soak-") as tmp:
            outcomes, _ = loadgen.replay([run_], endpoint, tokenizer=tokenizer,
                                         python=engine_python(settings),
                                         folder=Path(tmp), seed=config.seed, on_run=on_window,
                                         stop=lambda: bool(stopping))
    finally:
        sampler.halt.set()
        sampler.join(timeout=30)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return Sustained(windows, sampler.samples, outcomes, stopping[0] if stopping else None)


def add_trends(result: Result, config: Config) -> None:
    warmup = config.warmup_fraction * result.elapsed_s
    times = [s.t_s for s in result.samples]
    result.rss_trend = trend(times, [s.rss_mb for s in result.samples], warmup_s=warmup,
                             confidence=config.confidence)
    span = result.elapsed_s - warmup
    if span < config.min_hourly_s:
        result.inapplicable["soak.hourly"] = (
            f"{span:.0f} s after the warm-up, fewer than min_hourly_s "
            f"({config.min_hourly_s:g} s): too short to tell a trend per hour from warm-up "
            "(the per-request memory slope is judged)")
    if any(s.uss_mb is not None for s in result.samples):
        result.uss_trend = trend(times, [s.uss_mb for s in result.samples], warmup_s=warmup,
                                 confidence=config.confidence)
    # end-to-end latency, not TTFT: a fast model's first chunk is sometimes flushed with the
    # rest of its answer (vLLM for CPU), which makes TTFT bimodal
    done = [w for w in result.windows if w.e2el_p50_ms is not None and not w.error]
    if done:
        ref = statistics.median(w.e2el_p50_ms for w in done) or 1.0
        mids = [(w.start_s + w.end_s) / 2 for w in done]
        result.latency_trend = trend(mids, [100 * w.e2el_p50_ms / ref for w in done],
                                     warmup_s=warmup, confidence=config.confidence)
        result.throughput_trend = trend(mids, [w.output_throughput for w in done],
                                        warmup_s=warmup, confidence=config.confidence)
