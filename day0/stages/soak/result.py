"""The soak stage's Config and Result (windows, memory samples, trends, probes, boundaries)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from day0.execution.contract import Row, StageResult
from day0.durations import positive_seconds, seconds
from day0.stages.soak.trend import Trend

class Config(BaseModel):
    """Settings of the soak stage."""

    model_config = ConfigDict(extra="forbid")

    duration: str | float = Field("2m", description=(
        "How long the load lasts: 10h for a release soak (`day0 validate --duration 10h`), "
        "minutes in CI; e.g. 10h, 30m, 1h30m, 90s, or seconds."))
    workload: str = Field("short_qa", description="Workload of the workloads file replayed.")
    workloads_file: str | None = Field(None, description=(
        "YAML of workloads; default day0/data/workloads.yaml."))
    concurrency: int | None = Field(None, ge=1, le=4096, description=(
        "Requests in flight (default: the workload's highest concurrency level)."))
    sample_interval_s: float = Field(2.0, gt=0, le=600, description=(
        "Seconds between samples of the engine's memory and KV-cache usage."))
    warmup_fraction: float = Field(0.25, ge=0, lt=0.9, description=(
        "Share of the elapsed time left out of the trends (allocator and cache warm-up)."))
    min_hourly_s: float = Field(600.0, ge=0, description=(
        "Seconds after the warm-up the per-hour trends (memory, latency drift) need to be "
        "judged: over a shorter soak an engine's allocator warm-up looks like a leak of "
        "GiB/hour and a few ms of latency like a drift of 100 %/hour (the per-request "
        "memory slope is judged whatever the duration)."))
    confidence: float = Field(0.9, gt=0.5, lt=1, description=(
        "Confidence of the trends' intervals; gates judge the lower bound of a slope."))
    probes: int = Field(4, ge=1, le=64, description=(
        "Fixed prompts generated greedily before and after the soak; must not change."))
    probe_tokens: int = Field(16, ge=1, le=512, description="Tokens generated per probe.")
    boundaries: bool = Field(True, description=(
        "Before the soak: a request exactly at the context limit, one token below and one "
        "above (a clean 4xx, the engine still healthy), and the longest output."))
    seed: int = Field(0, description="Seed of the request lengths.")

    @field_validator("duration")
    @classmethod
    def _duration(cls, value):
        positive_seconds(value)
        return value

    @property
    def duration_s(self) -> float:
        return seconds(self.duration)


class Window(Row):
    """One load window (one run of the load generator) of the soak."""

    window: str
    start_s: float = Field(description="Seconds after the soak started.")
    end_s: float
    requests: int
    failed: int
    empty: int = Field(description="Completed requests with no output tokens.")
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2el_p50_ms: float | None = None
    tpot_p50_ms: float | None = None
    e2el_p99_ms: float | None = None
    output_throughput: float | None = None
    error: str | None = None


class Sample(Row):
    t_s: float = Field(description="Seconds after the soak started.")
    rss_mb: float | None = Field(description="Engine process tree RSS, MiB.")
    uss_mb: float | None = Field(description="Engine process tree USS, MiB (None: unreadable).")
    kv_usage: float | None = Field(description="The engine's KV-cache usage (0..1), if exported.")


class Boundary(Row):
    name: str
    prompt_tokens: int
    max_tokens: int
    expect: str = Field(description="ok or refused (a 4xx).")
    status: int | None
    passed: bool
    healthy_after: bool
    detail: str = ""


class Probe(Row):
    index: int
    before: str | None
    after: str | None
    changed: bool


class Result(StageResult):
    """Evidence of the soak stage."""

    endpoint: str
    load_generator: str
    workload: str
    concurrency: int
    planned_s: float = Field(description="The configured duration, seconds.")
    elapsed_s: float = Field(description="Seconds the load ran.")
    interrupted: str | None = Field(None, description=(
        "Why the soak stopped early (SIGTERM, the engine stopped answering); its evidence is "
        "what was measured until then."))
    windows: list[Window] = Field(default_factory=list)
    samples: list[Sample] = Field(default_factory=list)
    memory_source: str = Field(description="Whose memory was sampled.")
    rss_trend: Trend | None = None
    uss_trend: Trend | None = None
    latency_trend: Trend | None = Field(None, description=(
        "Per-window median end-to-end latency, as % of its median over the windows, per hour."))
    throughput_trend: Trend | None = None
    probes: list[Probe] = Field(default_factory=list)
    boundaries: list[Boundary] = Field(default_factory=list)
    healthy_after: bool = Field(description="/health answered after the soak.")
    notes: list[str] = Field(default_factory=list)
    inapplicable: dict[str, str] = Field(default_factory=dict, description=(
        "Metric prefix -> why its gates do not apply (a soak too short for a per-hour slope)."))

    def per_request(self, mib_per_h: float | None) -> float | None:
        """A memory slope (MiB/h) as KiB per completed request at the soak's request rate:
        what a per-request leak costs, whatever the hardware's throughput."""
        done = sum(w.requests - w.failed for w in self.windows)
        if mib_per_h is None or not done or not self.elapsed_s:
            return None
        return mib_per_h * 1024 / (done / self.elapsed_s * 3600)

    def metrics(self) -> dict[str, float | None]:
        return {
            "soak.interrupted": float(self.interrupted is not None),
            "soak.elapsed_fraction": self.elapsed_s / self.planned_s if self.planned_s else None,
            "soak.windows": float(len(self.windows)),
            "soak.failed_requests": float(sum(w.failed for w in self.windows)),
            "soak.empty_outputs": float(sum(w.empty for w in self.windows)),
            "soak.hourly.rss_slope_low_mb_per_h": (self.rss_trend or Trend.none()).low_per_h,
            "soak.hourly.rss_slope_mb_per_h": (self.rss_trend or Trend.none()).slope_per_h,
            "soak.memory.rss_low_kib_per_request": self.per_request(
                (self.rss_trend or Trend.none()).low_per_h),
            "soak.hourly.e2el_drift_low_pct_per_h": (self.latency_trend or Trend.none()).low_per_h,
            "soak.probes_changed": float(sum(p.changed for p in self.probes)),
            "soak.boundaries_failed": float(sum(not b.passed for b in self.boundaries)),
            "soak.unhealthy_after": float(not self.healthy_after),
        }
