"""Evaluation stage: are the model's capabilities intact on the target, item by item?

lm-eval (its Python API, its own model registry) runs the same tasks on the reference
(cpu/float32 in process, or its stored results for these weights and settings) and on the
target: a torch target through the ``day0`` lm-eval model (the checkpoint loaded as the target
loads it: device, dtype, plugins), an engine target through lm-eval's ``local-completions``
against the engine's OpenAI-compatible API. Tasks: day0's bundled ones, one per capability
(knowledge Q&A, code, math reasoning, long-context retrieval up to the model's context,
multi-turn agent format), a business regression set (JSONL), any lm-eval task whose data is
local.

What it proves: per category, the target answers the same items as correctly as the
reference, judged by paired tests in the gates (exact McNemar on per-item correctness, paired
bootstrap on the right choice's log-probability); the flipped items are listed. What it needs:
the checkpoint's weights and tokenizer here (the reference runs in process), an engine target's
endpoint. Runs after analysis; reads no other stage's result.
"""

from __future__ import annotations

from day0.execution.contract import Stage, import_core
from day0.stages.evaluation import preflight, report


class Evaluation(Stage):
    config_module = "config"
    after = ("analysis",)
    target_kinds = ("torch", "engine")
    uses_endpoint = True

    def core(self):
        return import_core(__name__)  # torch, transformers and lm-eval: only when it runs

    def warm(self) -> None:
        from day0.stages.evaluation.sides import warm

        warm()

    check_gates = staticmethod(preflight.check_gates)
    work = staticmethod(preflight.work)
    evidence = staticmethod(report.evidence)
    files = staticmethod(report.files)
    findings = staticmethod(report.findings)
    markdown = staticmethod(report.markdown)
    plots = staticmethod(report.plots)
    tables = staticmethod(report.tables)
