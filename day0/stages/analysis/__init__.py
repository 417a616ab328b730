"""Analysis stage: what a checkpoint is and what it needs, from config.json and headers only.

``run(Config(), StageInputs(source=...))`` reads config.json and every safetensors header (never
tensor data; see day0.checkpoint.headers), reads the config as transformers' class would (its defaults
and derived values as data: day0.checkpoint.configview), and reports architecture, attention kind, MoE
structure, RoPE, parameter counts, weight memory per dtype, KV cache per token and at max context,
a TP/PP/EP plan for the target's cards, a risk checklist, and header-level findings that the
checkpoint itself is broken (``checkpoint_problems``, day0.checkpoint.header_sanity). ``summary_text(result)``
renders it for a terminal. It imports no torch and no transformers (pyproject.toml's
analysis-no-torch contract): whether every tensor's name and shape fits transformers' class is
checked by the scan stage, which builds that class anyway, and before any stage loads the model.

Parameter counts: with weights, ``params.total`` is the exact sum of the header element counts
of the tensors transformers' class loads as parameters; tensors it does not use (decoder layers
at or beyond num_hidden_layers, such as MTP layers, and data/analysis.yaml's ``unused_by_class``)
are reported in ``params.unused``; quantization scales and persistent buffers are left out
(day0.checkpoint.headers.classify; scan compares these roles with the class's). Without weights it is
the parameter count of the class built on the meta device in a child process (tied weights once;
day0.stages.analysis.metaparams). ``params.active = total - routed_expert_params x (1 - k/E)``,
routed experts found by name (data/analysis.yaml).

What it proves: what the model is and whether the target can hold it (plan, memory, risks), and
whether the checkpoint's headers are sound. What it needs: config.json and the safetensors
headers (local or s3:// ranged reads), no weights data, no device, no other stage.
"""

from __future__ import annotations

from day0.execution.contract import Stage, import_core


class Analysis(Stage):
    config_module = "core"
    target_kinds = ("torch", "engine")  # config and headers only: any target

    def core(self):
        return import_core(__name__)

    def facts(self, result: dict) -> dict:
        from day0.stages.analysis.report import facts

        return facts(result)

    def markdown(self, evidence: dict, gates: list) -> str:
        from day0.stages.analysis.report import markdown

        return markdown(evidence, gates)
