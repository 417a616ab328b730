"""API alignment stage: does a serving engine compute what the cpu/float32 reference computes,
judged only through its OpenAI-compatible API, and is it as close as a known-good port?

Three sides see the same evaluation windows (token ids, like the in-process alignment stage's:
a start token, a few context-only positions, reaching the engine's max_model_len - 1):

* reference - the checkpoint in float32 on the reference device (in process, transformers);
* control   - the same implementation at the target's dtype on the reference device: what a
              correct port at that dtype costs;
* engine    - the target's engine, asked for ``prompt_logprobs: k`` (its logprob of every
              actual next token plus its top-k per position).

Measures per scored position (measures.py): the NLL of the actual next token (perplexity of
engine, control and reference), top-1 agreement, and a KL truncated to the side's own top-k
(report.KL_DEFINITION): the API gives k logprobs, not the vocabulary. Relative gates read paired
block-bootstrap lower bounds of engine/control ratios (day0.torchkit.paired). Greedy
continuations of prompts from the text are compared with vLLM's check_logprobs_close semantics
(day0.engines.greedy). Expert agreement (MoE) needs the engine's routed experts: vLLM 0.32
returns them only with --enable-return-routed-experts, which needs Model Runner V2 and Triton
(not in vLLM for CPU); for an MoE model the stage notes this and does not measure it.

What it proves: the served model's next-token distributions, perplexity and greedy
continuations agree with the checkpoint's as closely as a correct port at that dtype does (a
config or weight conversion bug in the engine's copy shows here). What it needs: an engine target and its endpoint (attached or launched by the flow), the
checkpoint's weights and tokenizer here (the reference and control run in process). Runs after
analysis; reads no other stage's result.
"""

from __future__ import annotations

from day0.contract import lazy_core

from day0.stages.api_alignment.plots import plots
from day0.stages.api_alignment.report import evidence, findings, markdown, tables

REQUIRES: tuple[str, ...] = ()
AFTER = ("analysis",)
TARGET_KINDS = ("engine",)
USES_ENDPOINT = True

CORE = ("Config", "Result", "run")


__getattr__ = lazy_core(__name__, CORE)  # the core imports torch: only when it runs


__all__ = ["REQUIRES", "AFTER", "TARGET_KINDS", "USES_ENDPOINT", "evidence", "markdown",
           "tables", "plots", "findings"]
