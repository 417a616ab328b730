"""Performance stage: how fast the served model answers, per workload and load level.

Each workload of the workloads file (short Q&A, a long document near the context limit,
multi-turn agent calls with a shared prefix and a growing history; YAML, user-overridable) is
replayed at each of its arrival levels (closed-loop concurrency or a Poisson rate) by vLLM's
benchmark client (``vllm bench serve``, in the engine's venv: :mod:`day0.engines.loadgen`), with
exact token counts. Figures follow vLLM's definitions: TTFT, TPOT, ITL and end-to-end latency
(p50/p90/p99), request and output-token throughput, goodput under the workload's SLOs, failed
requests.

Device (in-process PyTorch) targets get the same workloads as a kernel-level profile
(:mod:`day0.stages.performance.kernel`): prefill tokens/s and decode ms/token at batch 1 and 8,
compared with their baseline like load runs.

What it proves: the engine serves each workload within the gates' SLOs, without failed or empty
requests, and neither it nor a device target's kernels got slower than the promoted baseline.
What it needs: an engine target and its endpoint, the checkpoint's tokenizer, the engine venv
(the load generator); or a device target. Runs after analysis; reads no other stage's result.
"""

from __future__ import annotations

from day0.execution.contract import Option, Stage, import_core
from day0.stages.performance import report


class Performance(Stage):
    config_module = "result"
    after = ("analysis",)
    target_kinds = ("engine", "torch")
    uses_endpoint = True
    exclusive = True
    options = (Option("promote_baseline", setting="promote_baseline", kind="switch",
                      by_hand_only=True, help=(
                          "store this run's performance figures as the baseline of this model, "
                          "revision and target (later runs are gated against it)")),)

    def core(self):
        return import_core(__name__)

    evidence = staticmethod(report.evidence)
    files = staticmethod(report.files)
    findings = staticmethod(report.findings)
    markdown = staticmethod(report.markdown)
    plots = staticmethod(report.plots)
    tables = staticmethod(report.tables)
