"""Smoke stage: does the serving engine answer the OpenAI-compatible API as the checkpoint says?

Against ``inputs.endpoint`` (an engine target, attached or launched by the flow), with the
checkpoint's own tokenizer (transformers, day0's venv) as the reference:

* api          - the served model is listed; completions and chat completions, plain and
                 streamed, return text; ``max_tokens`` ends with finish_reason ``length``; a stop
                 string (a character of the greedy text) stops it there, not included;
* stream       - streamed deltas concatenate to the non-streamed greedy (temperature 0) text
                 (a part at a near tie - each token in the other's top-k - is accepted, as
                 vLLM's own tests do, and noted);
* usage        - prompt_tokens equals the checkpoint tokenizer's count of the prompt (chat: of
                 the chat template's rendering), prompt_token_ids (when returned) equal its ids,
                 completion_tokens equals the generated ids; generated ids are not re-encoded
                 (a greedy continuation need not be the canonical tokenization of its text);
* detokenize   - the checkpoint tokenizer decodes the generated ids to the engine's text;
* tokenizer    - the engine's ids (/tokenize, or prompt_token_ids of completions) equal
                 ``tokenizer(text, add_special_tokens=True)`` over day0/stages/smoke/data's hard texts
                 plus the checkpoint's own special-token strings; each mismatch is evidence;
* chat_template - the engine's ids of messages equal ``apply_chat_template(messages,
                 add_generation_prompt=True, tokenize=True)`` over the bundled conversations; a
                 checkpoint without a chat template: the chat checks are not applicable (rows
                 with a note, a finding, their metrics absent), never passed;
* overlong     - a prompt longer than the engine's max_model_len gets a 4xx, and the engine
                 answers afterwards;
* concurrency  - ``concurrency`` requests at once all succeed.

Each check is a row (name, family, passed, detail); metrics are counts (``smoke.checks_failed``
and one per family, smoke/metrics.yaml). An error status or malformed answer fails its
check; an engine that stops answering (EngineUnreachable, a StageError) ends the stage ERROR.

What it proves: the engine serves this checkpoint's tokenizer and chat template and its API
behaves. What it needs: the endpoint and the checkpoint's tokenizer files; no torch device.
"""

from __future__ import annotations

from day0.execution.contract import Stage, import_core
from day0.stages.smoke import report


class Smoke(Stage):
    config_module = "result"
    after = ("analysis",)
    target_kinds = ("engine",)
    uses_endpoint = True

    def core(self):
        return import_core(__name__)

    findings = staticmethod(report.findings)
    markdown = staticmethod(report.markdown)
    tables = staticmethod(report.tables)
