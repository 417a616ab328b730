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

from day0.execution.contract import Stage, import_core
from day0.stages.api_alignment import plots, report


class ApiAlignment(Stage):
    after = ("analysis",)
    target_kinds = ("engine",)
    uses_endpoint = True

    def core(self):
        return import_core(__name__)  # torch and transformers: only when it runs

    evidence = staticmethod(report.evidence)
    findings = staticmethod(report.findings)
    markdown = staticmethod(report.markdown)
    tables = staticmethod(report.tables)
    plots = staticmethod(plots.plots)
