"""Numerical alignment stage: does the target compute what the cpu/float32 reference computes,
and is it as close to it as a known-good port (the control) is?

Three models see the same windows: the reference (float32, reference device), the control (the
same implementation at the target's dtype on the reference device, no plugins) and the target.
Levels, from the smallest unit to end-to-end behaviour:

* operators   - every aten op of a short reference forward, replayed on the target (ops.py);
* layers      - each decoder layer's output error, target vs control, by position bucket;
* logits      - per-position KL(ref||target) vs KL(ref||control), top-1 agreement (logits.py);
* MoE routing - expert-set agreement of target and control with the reference (layers.py);
* perplexity  - target vs control on the same tokens (paired.py);
* generation  - greedy continuations of prompts from the text (generation.py).

Windows start like documents (BOS) with a few context-only positions and reach the model's
trained context (up to ``seq_len_cap``), run in chunks over a KV cache, so faults that only show
at far positions are found. Relative gates read paired block-bootstrap bounds (paired.py).

What it proves: the target computes what the reference computes, within what a correct port at
the target's dtype costs. What it needs: the checkpoint's weights and tokenizer (local or s3://,
materialised once), a torch device for the target, memory for three copies of the model
(day0.execution.budget), or, streamed (streamed.py), for about one layer of each. What the reference and
control compute is kept in the reference bank (bank.py) and replayed for every later target of
the same checkpoint: no reference or control forward (sides.py decides). Runs after analysis
(a checkpoint found broken there is not compared); reads no other stage's result.
"""

from __future__ import annotations

from day0.execution.contract import Option, Stage, import_core
from day0.stages.alignment import plots, report


class Alignment(Stage):
    config_module = "config"
    after = ("analysis",)
    options = (Option("text", setting="text_file", kind="file", metavar="FILE",
                      help="evaluation text for alignment (default: built-in)"),)

    def core(self):
        return import_core(__name__)  # torch and transformers: only when it runs

    evidence = staticmethod(report.evidence)
    findings = staticmethod(report.findings)
    markdown = staticmethod(report.markdown)
    plots = staticmethod(plots.plots)

    def tables(self, result: dict) -> dict:
        """Prefect table artifacts: the per-layer errors (target, control, ratio, bound)."""
        rows = report.layer_rows(result)
        return {"day0-layers": ("Per-layer relative error, target and control vs reference; a "
                                "layer diverges when ratio low exceeds its bound", rows)} \
            if rows else {}
