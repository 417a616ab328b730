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

from day0.contract import lazy_core

from day0.stages.evaluation.preflight import check_gates
from day0.stages.evaluation.report import evidence, files, findings, markdown, plots, tables

REQUIRES: tuple[str, ...] = ()
AFTER = ("analysis",)
TARGET_KINDS = ("torch", "engine")
USES_ENDPOINT = True

CORE = ("Config", "Result", "run")


__getattr__ = lazy_core(__name__, CORE)  # the core imports torch: only when it runs


__all__ = ["REQUIRES", "AFTER", "TARGET_KINDS", "USES_ENDPOINT", "check_gates", "evidence",
           "markdown", "tables", "plots", "findings", "files"]
