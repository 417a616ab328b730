"""Soak stage: the served model under sustained load for a duration, watched for leaks, drift,
failures and changed answers.

One workload (default short_qa) is replayed by vLLM's benchmark client at a fixed concurrency,
window after window, until ``duration`` (``--duration 10h`` for a release; minutes in CI). All
the while the engine's process tree memory (RSS, USS) and its KV-cache usage are sampled; each
window's latency and throughput are kept. After a warm-up share, Theil-Sen slopes with their
intervals give the memory growth in MiB/hour and the latency drift in %/hour, which the gates
judge on their lower bounds. Before the load: greedy probes and the context boundaries (at the
limit, one below, one above which must be a clean 4xx with the engine still healthy, the
longest output); after it: the same probes, which must not have changed. A SIGTERM ends the
load early and the stage reports what it measured, saying so.

What it proves: the engine stays correct and healthy under sustained load (no failed or empty
requests, unchanged greedy answers, clean refusals at the context limit) and neither its memory
nor its latency keeps growing. What it needs: an engine target and its endpoint (its memory only when the engine runs on this
machine), the checkpoint's tokenizer, the engine venv (the load generator). Runs alone, last.
"""

from __future__ import annotations

from day0.execution.contract import Option, Stage, Work, import_core
from day0.durations import positive_seconds
from day0.stages.soak import report


class Soak(Stage):
    config_module = "result"
    after = ("analysis",)
    target_kinds = ("engine",)
    uses_endpoint = True
    exclusive = True
    options = (Option("duration", setting="duration", metavar="DURATION", check=positive_seconds,
                      help="how long the soak stage keeps the engine under load, e.g. 10h, 30m, "
                           "1h30m, 90s (default 2m; engine targets)"),)

    def core(self):
        return import_core(__name__)

    def work(self, config: dict) -> Work:
        """Its configured duration (default 2m): the soak runs that long by design."""
        from day0.stages.soak.result import Config

        return Work(seconds=Config.model_validate(config).duration_s)

    findings = staticmethod(report.findings)
    markdown = staticmethod(report.markdown)
    plots = staticmethod(report.plots)
    tables = staticmethod(report.tables)
