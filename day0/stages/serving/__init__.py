"""Serving stage: an engine's serving features give the plain configuration's results.

A fixed prompt set (token ids cut from the evaluation text with the checkpoint's tokenizer;
every prompt starts with the same long prefix and is longer than a small chunked-prefill
budget; see :mod:`.prompts`) is generated greedily (temperature 0, ``new_tokens`` tokens, top-k
logprobs) on the plain configuration (``inputs.endpoint``): the baseline. Then:

* repeat: the baseline once more, the same way (the engine's own run-to-run noise);
* batching: every prompt inside ``concurrency`` simultaneous requests (padded with other
  prompts) on the plain configuration, compared with the baseline (each prompt alone);
* variants: each of ``engine.variants`` (or the configured subset) is launched with its extra
  arguments, one at a time, runs the prompt set (twice for prefix caching) and is compared with
  the baseline; prefix caching must be shown to hit, a token budget to split (see
  :mod:`.variants`). A variant that does not start ends the stage ERROR with its log tail.

Every comparison (:mod:`.compare`) is vLLM's check_logprobs_close on the tokens plus
max |Δlogprob| of the matched tokens <= ``logprob_tolerance``.

What it proves: the declared variants and continuous batching give the plain configuration's
tokens and logprobs on this checkpoint. What it needs: an engine target, its running plain
configuration, the checkpoint's tokenizer, launch mode for variants.
"""

from __future__ import annotations

from day0.execution.contract import Stage, import_core
from day0.stages.serving import report


class Serving(Stage):
    config_module = "core"
    after = ("analysis",)
    target_kinds = ("engine",)
    uses_endpoint = True

    def core(self):
        return import_core(__name__)

    markdown = staticmethod(report.markdown)
    findings = staticmethod(report.findings)
