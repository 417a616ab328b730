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

from day0.stages.performance.core import run
from day0.stages.performance.report import evidence, files, findings, markdown, plots, tables
from day0.stages.performance.result import Config, Result

REQUIRES: tuple[str, ...] = ()
AFTER = ("analysis",)
TARGET_KINDS = ("engine", "torch")
USES_ENDPOINT = True
EXCLUSIVE = True

__all__ = ["Config", "Result", "run", "REQUIRES", "AFTER", "TARGET_KINDS", "USES_ENDPOINT",
           "EXCLUSIVE", "evidence", "markdown", "tables", "plots", "findings", "files"]
