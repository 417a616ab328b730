"""The performance stage's Config and Result (per-run rows, metrics for the gates)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from day0.execution.contract import Row, StageResult
from day0.stages.performance.compare import Slowdown

QUANTILES = ("p50", "p90", "p99")
LATENCIES = ("ttft", "tpot", "itl", "e2el")


class Config(BaseModel):
    """Settings of the performance stage."""

    model_config = ConfigDict(extra="forbid")

    workloads_file: str | None = Field(None, description=(
        "YAML of workloads; default day0/data/workloads.yaml "
        "(docs/performance-and-soak.md)."))
    workloads: list[str] | None = Field(None, description=(
        "Names of the workloads to run (default: every one in the file)."))
    seed: int = Field(0, description="Seed of the request lengths (same trace on every run).")
    promote_baseline: bool = Field(False, description=(
        "Store this run's figures as the baseline of this model, revision and target (only "
        "ever on request: `day0 validate --promote-baseline`, the deployment parameter "
        "promote_baseline, or `day0 baseline promote RUN_FOLDER` later)."))
    baseline_store: str | None = Field(None, description=(
        "Folder or s3:// prefix of the baseline; default <results>/<model>/<revision>/<target>/"
        "baseline/ under the results location, else day0's cache dir."))
    regression_quantile: float = Field(0.5, gt=0, lt=1, description=(
        "Latency quantile compared with the baseline (the median: what most requests see, "
        "stable with tens of requests; a tail quantile of 24 requests is one or two of them)."))
    min_requests: int = Field(12, ge=2, description=(
        "Completed requests a run and its baseline each need to be compared (fewer: the "
        "workload's baseline gates are not applicable, with a note)."))
    regression_confidence: float = Field(0.9, gt=0.5, lt=1, description=(
        "Two-sided confidence of the slowdown's bootstrap interval; gates judge its lower "
        "bound."))
    resolution_ms: float = Field(1.0, gt=0, description=(
        "Latencies below this count as this much in baseline ratios (streaming granularity: "
        "a tiny model's tokens can arrive in one burst)."))
    warmups_per_slot: int = Field(2, ge=0, le=64, description=(
        "Unmeasured warm-up requests per concurrency slot before each run (a fresh engine's "
        "first requests are not what it serves later)."))
    confirm_above: float = Field(1.3, gt=1, description=(
        "A run whose slowdown's lower bound (any latency) exceeds this is measured again at "
        "once, and the less slow attempt counts: a regression must reproduce, a one-off stall "
        "of a shared machine does not fail a release."))
    confirm_attempts: int = Field(2, ge=0, le=5, description=(
        "Extra attempts of a run that looks slower than its baseline (0: no confirmation)."))
    confirm_kinds: list[Literal["ttft", "tpot", "e2el"]] = Field(
        default_factory=lambda: ["tpot", "e2el"], description=(
            "Latencies whose slowdown triggers a confirmation (those gated as errors; TTFT "
            "scatters on CPU engines, see docs/performance-and-soak.md)."))
    kernel_confirm_above: float = Field(1.15, gt=1, description=(
        "Device targets: a kernel profile's run whose prefill or decode slowdown lower bound "
        "exceeds this is measured again (confirm_attempts), below the kernel gates' 1.25 so a "
        "one-off stall never fails them unconfirmed."))
    resamples: int = Field(2000, ge=200, le=100_000, description="Bootstrap resamples.")
    kernel_batches: list[int] = Field(default_factory=lambda: [1, 8], min_length=1, description=(
        "Device (in-process) targets: batch sizes of the kernel profile."))
    kernel_repeats: int = Field(5, ge=2, le=100, description=(
        "Device targets: measured repeats per workload and batch (after one warm-up)."))
    kernel_decode_steps: int = Field(16, ge=1, le=1024, description=(
        "Device targets: decode steps per repeat (at most the workload's median output)."))
    kernel_max_tokens: int = Field(2048, ge=1, description=(
        "Device targets: prompt tokens per prefill forward (batch x prompt) at most; longer "
        "prompts are cut, with a note (a CPU target's long documents at batch 8 would take "
        "minutes a repeat)."))
    client_bound_share: float = Field(0.8, gt=0, le=64, description=(
        "A run is flagged client-bound when the load generator kept this many cores busy "
        "(its figures then measure the client as much as the engine; bench/bench_loadgen.py "
        "prints the client's ceiling)."))


class RunRow(Row):
    """One load run: a workload at one arrival level, vLLM's aggregates."""

    run: str = Field(description="Run id: <workload>-c<concurrency> or -r<rate>.")
    workload: str
    level: str = Field(description="c<N>: N in flight; r<R>: Poisson R/s.")
    requests: int = Field(description="Requests sent.")
    completed: int = Field(0)
    failed: int = Field(0)
    empty: int = Field(0, description="Completed requests with no output text.")
    length_mismatches: int = Field(0, description=(
        "Requests whose prompt or output token count differs from the trace's."))
    duration_s: float | None = None
    request_throughput: float | None = Field(None, description="Requests/s.")
    output_throughput: float | None = Field(None, description="Output tokens/s.")
    goodput_fraction: float | None = Field(None, description=(
        "Share of requests meeting the workload's SLOs (None without SLOs)."))
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p90_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p90_ms: float | None = None
    itl_p99_ms: float | None = None
    e2el_p50_ms: float | None = None
    e2el_p90_ms: float | None = None
    e2el_p99_ms: float | None = None
    error: str | None = Field(None, description="Why the run has no figures.")
    baseline_key: str | None = Field(None, description=(
        "Digest of the run's requests and arrival: compared only with a baseline of the same."))
    client_cpu_share: float | None = Field(None, description=(
        "Cores the load generator kept busy during this run (1.0: one core)."))
    client_bound: bool = Field(False, description="Figures near the client's own ceiling.")
    batch: int | None = Field(None, description="Kernel profile (device targets): batch size.")
    prompt_tokens: int | None = Field(None, description="Kernel profile: prompt per sequence.")
    decode_steps: int | None = Field(None, description="Kernel profile: decode steps a repeat.")
    prefill_tokens_per_s: float | None = Field(None, description=(
        "Kernel profile: batch x prompt tokens / prefill time (median over repeats)."))
    decode_ms_per_token: float | None = Field(None, description=(
        "Kernel profile: one decode step (a token for every sequence), median over repeats."))


class Request(BaseModel):
    """One request of a run (per-request file next to report.json)."""

    model_config = ConfigDict(extra="forbid")

    run: str
    index: int
    input_tokens: int | None
    output_tokens: int | None
    start_s: float | None = Field(None, description="Sent, seconds after the run started.")
    ttft_ms: float | None
    e2el_ms: float | None
    itl_ms: list[float] = Field(default_factory=list)
    error: str | None = None


class Result(StageResult):
    """Evidence of the performance stage."""

    endpoint: str = Field(description="Engine measured.")
    load_generator: str = Field(description="The load generator and its version.")
    definitions: str = Field(description="Whose metric definitions the figures follow.")
    context: int = Field(description="The engine's max_model_len the workloads were sized for.")
    runs: list[RunRow] = Field(default_factory=list)
    requests: list[Request] = Field(default_factory=list, repr=False)
    slowdowns: list[Slowdown] = Field(default_factory=list, description=(
        "Per run with a baseline of the same requests: quantile ratios and intervals."))
    baseline: str | None = Field(None, description="Where the baseline was looked for.")
    baseline_promoted: dict | None = Field(None, description=(
        "The compared baseline's promotion (from which run, when)."))
    promoted_to: str | None = Field(None, description="This run was promoted: the baseline URI.")
    inapplicable: dict[str, str] = Field(default_factory=dict, description=(
        "Metric prefix -> why its gates do not apply (no baseline to compare with)."))
    attempts: dict[str, list[float | None]] = Field(default_factory=dict, description=(
        "Runs measured again to confirm a slowdown: per run each attempt's largest "
        "slowdown lower bound (the least slow attempt's figures are reported)."))
    client_wall_s: float = 0.0
    client_cpu_s: float = 0.0
    notes: list[str] = Field(default_factory=list)

    def _gated(self) -> dict[str, RunRow]:
        """Per workload the run at its highest level (what the workload's metrics report)."""
        out: dict[str, RunRow] = {}
        for row in self.runs:
            out[row.workload] = row  # runs are in level order
        return out

    def metrics(self) -> dict[str, float | None]:
        m: dict[str, float | None] = {
            "performance.failed_requests": float(sum(r.failed for r in self.runs)),
            "performance.unfinished_runs": float(sum(r.error is not None for r in self.runs)),
            "performance.empty_outputs": float(sum(r.empty for r in self.runs)),
            "performance.length_mismatches": float(sum(r.length_mismatches for r in self.runs)),
            "performance.client_bound_runs": float(sum(r.client_bound for r in self.runs)),
        }
        for name, row in self._gated().items():
            if row.batch is not None:  # a device target's kernel profile: its own figures
                m[f"performance.{name}.prefill_tokens_per_s"] = row.prefill_tokens_per_s
                m[f"performance.{name}.decode_ms_per_token"] = row.decode_ms_per_token
                continue
            for lat in LATENCIES:
                for q in QUANTILES:
                    m[f"performance.{name}.{lat}_{q}_ms"] = getattr(row, f"{lat}_{q}_ms")
            m[f"performance.{name}.request_throughput"] = row.request_throughput
            m[f"performance.{name}.output_throughput"] = row.output_throughput
            if row.goodput_fraction is not None:
                m[f"performance.{name}.goodput_fraction"] = row.goodput_fraction
        kernel = {r.run for r in self.runs if r.batch is not None}
        for slow in self.slowdowns:  # per workload its worst level
            kind = slow.kind
            if slow.run in kernel:  # prefill and decode; the sum of both adds nothing
                if kind == "e2el":
                    continue
                kind = {"ttft": "prefill", "tpot": "decode"}[kind]
            key = f"performance.baseline.{slow.workload}.{kind}_slowdown"
            if slow.low is not None and (m.get(key) is None or slow.low > m[key]):
                m[key] = slow.low
        return m
