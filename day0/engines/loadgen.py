"""Load runs against an engine through vLLM's benchmark client (``vllm bench serve``).

day0 writes each run's requests as a timed trace (vLLM's ``timed_trace`` dataset: per request
its timestamp, exact input and output token counts and the hash ids of its 16-token blocks, so
requests that share leading ids share a prefix) and lets vLLM's client replay it: vLLM's request
functions, its TTFT/TPOT/ITL/E2EL definitions and aggregates, its goodput. The client runs in
the engine's venv (:mod:`day0.engines.vllm_bench_driver`, one process for all runs), bounded
in time: past ``timeout_s`` it is stopped and the runs it finished are kept.

Metric definitions (vLLM's ``vllm bench serve``): TTFT = first streamed token - request sent;
TPOT = (E2EL - TTFT) / (output tokens - 1) per request; ITL = gaps between streamed chunks;
E2EL = last token - request sent; throughputs over the run's wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Callable

import psutil
from pydantic import BaseModel, ConfigDict, Field

from day0.engines.settings import Endpoint, EngineSettings

DRIVER = Path(__file__).with_name("vllm_bench_driver.py")
CHUNK = 16  # tokens per hash id: vLLM's timed-trace default block
PERCENTILES = "50,90,99"


class TraceEntry(BaseModel):
    """One request of a timed trace, in vLLM's field names."""

    model_config = ConfigDict(extra="forbid")

    timestamp: float = Field(0.0, ge=0, description="Seconds after the run starts (self-timed).")
    input_length: int = Field(ge=1, description="Prompt tokens, exactly.")
    output_length: int = Field(ge=1, description="Tokens generated, exactly (EOS ignored).")
    hash_ids: list[int] = Field(description="One id per 16-token block of the prompt; equal "
                                            "leading ids give equal leading tokens.")


class LoadRun(BaseModel):
    """One invocation of the load generator: a trace and how it arrives."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Run name, e.g. short_qa-c4.")
    trace: list[TraceEntry] = Field(repr=False, description="The requests, in sending order.")
    concurrency: int | None = Field(None, ge=1, description="Closed loop: requests in flight.")
    rate: float | None = Field(None, gt=0, description="Open loop: Poisson arrivals per second.")
    self_timed: bool = Field(False, description="Send each request at its trace timestamp.")
    goodput: dict[str, float] = Field(default_factory=dict, description=(
        "SLOs in ms (ttft, tpot, e2el): a request is good when it meets all of them."))
    max_duration_s: float = Field(gt=0, description=(
        "Time bound of the run (a repeated run: of each window)."))
    repeat_until: float | None = Field(None, description=(
        "Unix time: repeat the run as windows <id>-w0001, ... until then (a soak)."))
    warmups: int = Field(0, ge=0, description=(
        "Unmeasured requests sent first (vLLM's --num-warmups: the trace's first request)."))


def argv(run: LoadRun, endpoint: Endpoint, tokenizer: str, trace_path: Path,
         seed: int) -> list[str]:
    """``vllm bench serve`` arguments of one run."""
    args = ["--backend", "vllm", "--base-url", endpoint.base_url, "--endpoint", "/v1/completions",
            "--model", endpoint.served_name, "--tokenizer", tokenizer,
            "--dataset-name", "timed_trace", "--dataset-path", str(trace_path),
            "--timed-trace-chunk-hash-size", str(CHUNK),
            "--num-prompts", str(len(run.trace)), "--seed", str(seed), "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", PERCENTILES,
            "--save-detailed", "--disable-tqdm", "--num-warmups", str(run.warmups),
            "--ready-check-timeout-sec", "30"]
    args += ["--self-timed"] if run.self_timed else ["--no-self-timed"]
    args += ["--request-rate", str(run.rate) if run.rate else "inf"]
    if run.concurrency:
        args += ["--max-concurrency", str(run.concurrency)]
    if run.goodput:
        args += ["--goodput", *[f"{k}:{v:g}" for k, v in sorted(run.goodput.items())]]
    return args


class RunOutcome(BaseModel):
    """What the load generator gave for one run (vLLM's result, detailed), or why not."""

    model_config = ConfigDict(extra="forbid")

    id: str
    result: dict | None = Field(None, repr=False, description="vLLM's result JSON.")
    error: str | None = Field(None, description="Why the run gave no result.")
    started: float | None = Field(None, description="Unix time the run started.")
    ended: float | None = Field(None, description="Unix time the run ended.")
    client: str | None = Field(None, description="The load generator and its version.")
    client_cpu_s: float | None = Field(None, description="CPU seconds the client used for it.")

    @property
    def client_cores(self) -> float | None:
        """Cores the client kept busy during the run (1.0: one core's worth)."""
        if self.client_cpu_s is None or not self.started or not self.ended:
            return None
        return self.client_cpu_s / max(self.ended - self.started, 1e-6)


class ClientUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wall_s: float = Field(description="Seconds the load generator ran.")
    cpu_s: float = Field(description="CPU seconds it used (user + system, with children).")


class Served(BaseModel):
    """What a load stage works against: the engine, its settings, the checkpoint, the context."""

    model_config = ConfigDict(extra="forbid")

    endpoint: Endpoint
    settings: EngineSettings
    folder: Path = Field(description="The checkpoint's local folder (its tokenizer).")
    context: int = Field(description="The engine's max_model_len (capped by the checkpoint).")


def served(inputs, stage: str) -> Served:
    """The engine a stage loads (StageError without one) and the checkpoint it serves."""
    from day0.engines.process import max_model_len
    from day0.errors import StageError
    from day0.store.sources import local_checkpoint
    from day0.torchkit.evaltext import checkpoint_dir

    if inputs.endpoint is None:
        raise StageError(f"the {stage} stage needs an engine endpoint (an engine target: "
                         "attached by engine.base_url or launched by the flow)")
    settings = inputs.target.engine or EngineSettings(base_url=inputs.endpoint.base_url)
    folder = checkpoint_dir(local_checkpoint(inputs.source))
    return Served(endpoint=inputs.endpoint, settings=settings, folder=folder,
                  context=max_model_len(settings, str(folder)))


def replay(runs: list[LoadRun], endpoint: Endpoint, *, tokenizer: str, python: str,
           folder: Path, seed: int = 0, log: Callable[[str], None] = print,
           on_run: Callable[[RunOutcome], None] | None = None,
           stop: Callable[[], bool] | None = None) -> tuple[list[RunOutcome], ClientUsage]:
    """Run every load run in order; the outcomes in the order they finished, then one with a
    reason per planned run that never ran (a repeated run's windows are named <id>-wNNNN).
    on_run sees each outcome as soon as its run finishes (progress, partial evidence); when
    stop() turns true the client is stopped and what finished is kept."""
    folder.mkdir(parents=True, exist_ok=True)
    plan = {"runs": []}
    for run in runs:
        trace = folder / f"{run.id}.trace.jsonl"
        trace.write_text("".join(e.model_dump_json() + "\n" for e in run.trace))
        plan["runs"].append({"id": run.id, "argv": argv(run, endpoint, tokenizer, trace, seed),
                             "repeat_until": run.repeat_until})
    (folder / "plan.json").write_text(json.dumps(plan, indent=1))
    out = folder / "results.jsonl"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONHASHSEED": "0", "VLLM_LOGGING_LEVEL": "WARNING",
           "PYTHONUNBUFFERED": "1"}
    env.pop("OPENAI_API_KEY", None)
    if endpoint.api_key_env and os.environ.get(endpoint.api_key_env):
        env["OPENAI_API_KEY"] = os.environ[endpoint.api_key_env]
    # a bound per run plus the client's start (vLLM imports in ~10 s)
    deadline = time.monotonic() + 120 + sum(
        r.max_duration_s + max(0.0, (r.repeat_until or 0) - time.time()) for r in runs)
    started = time.monotonic()
    outcomes: dict[str, RunOutcome] = {}
    cpu_s = 0.0
    with open(folder / "client.log", "w") as client_log:
        # in the caller's process group: a stage's group kill (its end, its owner's death,
        # a SIGTERM passed on) takes the client with it
        proc = subprocess.Popen([python, str(DRIVER), str(folder / "plan.json"), str(out)],
                                stdout=client_log, stderr=subprocess.STDOUT, env=env)
        watched = psutil.Process(proc.pid)
        read = 0
        try:
            while True:
                done = proc.poll() is not None
                read = _collect(out, read, outcomes, on_run)
                if done:
                    break
                try:
                    times = watched.cpu_times()
                    cpu_s = times.user + times.system + times.children_user + times.children_system
                except psutil.Error:
                    pass
                if time.monotonic() > deadline or (stop and stop()):
                    if not (stop and stop()):
                        log("load generator past its time bound: stopped, finished runs kept")
                    proc.kill()
                    proc.wait()
                    break
                time.sleep(0.25)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        _collect(out, read, outcomes, on_run)
    usage = ClientUsage(wall_s=round(time.monotonic() - started, 3), cpu_s=round(cpu_s, 3))
    tail = (folder / "client.log").read_text(errors="replace").splitlines()[-5:]
    result = list(outcomes.values())
    for run in runs:
        if run.id not in outcomes and not any(k.startswith(run.id + "-w") for k in outcomes):
            why = ("stopped on request" if stop and stop() else
                   "not run: the load generator stopped before it (exit "
                   f"{proc.returncode}; {' | '.join(tail)[-300:]})")
            result.append(RunOutcome(id=run.id, error=why))
    return result, usage


def _collect(out: Path, read: int, outcomes: dict, on_run) -> int:
    """New finished runs from the driver's output (complete lines only)."""
    try:
        data = out.read_bytes()
    except FileNotFoundError:
        return read
    end = data.rfind(b"\n") + 1
    for line in data[read:end].splitlines():
        row = json.loads(line)
        outcome = RunOutcome(id=row["id"], result=row.get("result"), error=row.get("error"),
                             started=row.get("started"), ended=row.get("ended"),
                             client=row.get("client"), client_cpu_s=row.get("client_cpu_s"))
        outcomes[outcome.id] = outcome
        if on_run:
            on_run(outcome)
    return max(read, end)


__all__ = ["TraceEntry", "LoadRun", "RunOutcome", "ClientUsage", "Served", "served", "replay",
           "argv", "CHUNK"]
