"""Chat stage: does the served model answer a conversation as the checkpoint answers it?

Each conversation (single- and multi-turn, with and without a system prompt, tool-call formatted
where the chat template renders tools; bundled in data/conversations.jsonl, yours added by
``--chat-conversations FILE``) is answered greedily, EOS ignored, by four sides:

* engine chat   - the engine through ``/v1/chat/completions``, rendering the prompt with its own
                  chat template and its own request defaults (only temperature 0, the length
                  and logprobs are set);
* engine prompt - the engine through ``/v1/completions`` on the checkpoint's own prompt ids,
                  with ``prompt_logprobs`` (its prefill) and the same greedy answer;
* reference     - the checkpoint in float32 in process (transformers, the checkpoint's chat
                  template, generate with a KV cache);
* control       - the same at the target's dtype: what a correct port at that dtype answers.

Answers are compared as vLLM's ``check_logprobs_close`` compares them: equal up to the first
differing token, where each side's token must be in the other's top-k, and (stricter) each
side's margin between the two tokens at most ``max_tie_gap`` nats: a near-tie that rounding
flips. Gates read the conversations not close, against the control's count. Per conversation
the report diagnoses where a divergence starts: another prompt (the engine's template), another
answer for the same ids (the chat path or its request defaults), the prompt's logprobs off
(prefill), or only the answer's (decode: the engine's per-step logprobs of its own tokens
against the reference's teacher-forced logprobs of the same tokens, decoded one by one with
the KV cache); and at the first difference the top-k of both sides.

What it proves: the engine's chat path answers like the checkpoint, prompt rendering, request
defaults, prefill and decode included, not only scores text like it. What it needs: an engine
target and its endpoint, the checkpoint's weights, tokenizer and chat template here. Runs after
analysis; reads no other stage's result.
"""

from __future__ import annotations

from day0.errors import ConfigError
from day0.execution.contract import Option, Stage, import_core
from day0.stages.chat import conversations, report


def _readable_conversations(path: str) -> None:
    """A bad file is refused when the option is read (exit 2), not once an engine runs."""
    try:
        conversations.load(path)
    except ConfigError as exc:
        raise ValueError(exc.args[0]) from None


class Chat(Stage):
    after = ("analysis",)
    target_kinds = ("engine",)
    uses_endpoint = True
    options = (Option("chat_conversations", "conversations_file",
                      "JSONL of your own conversations, answered after the bundled ones "
                      '(one per line: {"id", "messages", "tools"?})', kind="file",
                      metavar="FILE", check=_readable_conversations),)

    def core(self):
        return import_core(__name__)  # torch and transformers: only when it runs

    findings = staticmethod(report.findings)
    markdown = staticmethod(report.markdown)
    tables = staticmethod(report.tables)
