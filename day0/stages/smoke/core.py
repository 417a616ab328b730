"""run(config, inputs): every smoke check against inputs.endpoint, in a fixed order."""

from __future__ import annotations

import time

from day0.execution.contract import StageInputs
from day0.engines.client import EngineClient
from day0.errors import StageError
from day0.stages.smoke.checks import (CHAT, COMPLETION, Session, chat_not_applicable,
                                      generation_checks, models_check)
from day0.stages.smoke.load import concurrency_check, overlong_check
from day0.stages.smoke.parity import load_conversations, load_texts, special_texts
from day0.stages.smoke.result import Config, Result
from day0.stages.smoke.tokens import (chat_template_parity, no_chat_template, renderable,
                                      tokenizer_parity)


def _engine_context(s: Session, settings, folder: str) -> int:
    """The engine's max_model_len: the target's setting capped by max_position_embeddings
    (day0.engines.process), or what /v1/models reports when that is larger (an over-long
    prompt must exceed what the engine really accepts)."""
    from day0.engines.process import max_model_len

    limit = max_model_len(settings, folder)
    status, answer = s.client.send("GET", "/v1/models")
    for model in (answer.get("data") or []) if status == 200 and isinstance(answer, dict) else []:
        reported = model.get("max_model_len") if isinstance(model, dict) else None
        if model.get("id") == s.served and isinstance(reported, int) and reported > limit:
            s.notes.append(f"/v1/models reports max_model_len {reported} > the target's {limit}: "
                           "the over-long prompt exceeds the reported one")
            return reported
    return limit


def run(config: Config, inputs: StageInputs) -> Result:
    """Smoke-test the engine at inputs.endpoint against the checkpoint at inputs.source.

    Raises StageError (ERROR) without an endpoint, and EngineUnreachable (a StageError) when the
    engine stops answering mid-stage; every other engine misbehaviour is a failed check."""
    from day0.engines.settings import EngineSettings
    from day0.store.sources import local_checkpoint
    from day0.torchkit.evaltext import checkpoint_dir, load_tokenizer

    started = time.monotonic()
    endpoint = inputs.endpoint
    if endpoint is None:
        raise StageError("the smoke stage needs an engine endpoint (an engine target: attached "
                         "by engine.base_url or launched by the flow)")
    settings = inputs.target.engine or EngineSettings(base_url=endpoint.base_url)
    timeout_s = config.request_timeout_s or settings.request_timeout_s
    texts = load_texts(config.texts_file)
    conversations = load_conversations(config.conversations_file)
    folder = str(checkpoint_dir(local_checkpoint(inputs.source)))
    tokenizer = load_tokenizer(folder, trust_remote_code=inputs.trust_remote_code)

    with EngineClient.of(endpoint, timeout_s=timeout_s) as client:
        s = Session(config=config, client=client, served=endpoint.served_name, tokenizer=tokenizer)
        models_check(s)
        tok = tokenizer_parity(s, texts + special_texts(tokenizer))
        usable: list = []
        if not getattr(tokenizer, "chat_template", None):
            chat = no_chat_template(s, conversations)
        elif usable := renderable(s, conversations):
            chat = chat_template_parity(s, usable)
        else:
            chat = no_chat_template(s, conversations, "the checkpoint's chat template refuses "
                                                      "every bundled conversation")
        generation_checks(s, COMPLETION, list(config.prompts))
        if chat.applicable:
            generation_checks(s, CHAT, [messages for _, messages in usable])
        else:
            chat_not_applicable(s, chat.note)
        overlong = overlong_check(s, _engine_context(s, settings, folder))
        concurrency = concurrency_check(s, endpoint, timeout_s)
    return Result(served_name=endpoint.served_name, base_url=endpoint.base_url, checks=s.checks,
                  tokenizer=tok, chat_template=chat, overlong=overlong, concurrency=concurrency,
                  stream_mismatches=s.counts["stream"], usage_mismatches=s.counts["usage"],
                  detokenize_mismatches=s.counts["detokenize"], notes=s.notes,
                  wall_s=round(time.monotonic() - started, 3))


__all__ = ["run"]
