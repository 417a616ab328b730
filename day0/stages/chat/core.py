"""The chat stage's core: each conversation answered greedily by the engine's chat path, by its
completions path on the checkpoint's prompt ids, by the reference and by the control; the
answers compared at their first difference, the prompt (prefill) and answer (decode) logprobs
compared with the reference's teacher-forced ones (see the package docstring)."""

from __future__ import annotations

import torch

from day0.engines.client import EngineClient
from day0.engines.greedy import compare_greedy
from day0.engines.logprobs import Engine, EngineVsControl
from day0.engines.process import max_model_len
from day0.errors import ConfigError
from day0.execution import progress
from day0.execution.contract import Laps, StageInputs
from day0.stages.chat.conversations import Conversation, conversations, template_messages
from day0.stages.chat.result import Config, ConversationRow, Result, Top
from day0.store.sources import local_checkpoint
from day0.torchkit.evaltext import chat_ids, load_tokenizer
from day0.torchkit.inprocess import Side, load_sides, token_logprobs
from day0.torchkit.paired import Blocks, ratios

TOP_SHOWN = 5  # tokens of each side's top-k shown at a first difference
# what vLLM takes from generation_config.json as request defaults (vllm/config/model.py,
# get_diff_sampling_param)
SAMPLING_FIELDS = ("repetition_penalty", "presence_penalty", "frequency_penalty",
                   "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
TIE = 1e-6  # nats: a chosen token this close to the top logprob is a top-1 (a tie)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def run(config: Config, inputs: StageInputs) -> Result:
    laps = Laps()
    target = inputs.target
    if inputs.endpoint is None or target.engine is None:
        raise ConfigError("the chat stage needs an engine target and its endpoint",
                          field="target.engine", fix="run it on a target of kind: engine "
                          "(the flow attaches or launches the engine)")
    chosen = conversations(config.bundled_conversations, config.conversations_file)
    progress.plan({"models": 1, "conversations": len(chosen)})
    source = local_checkpoint(inputs.source, log=print)
    tokenizer = load_tokenizer(source, inputs.trust_remote_code)
    notes: list[str] = []
    limit = max_model_len(target.engine, source)
    rendered = _renderable(tokenizer, chosen, limit - config.new_tokens, notes)
    ref, ctl = load_sides(source, inputs)
    laps.lap("load")
    client = EngineClient.of(inputs.endpoint, timeout_s=target.engine.request_timeout_s)
    engine = Engine(client, inputs.endpoint.served_name)
    rows: list[ConversationRow] = []
    pairs: dict[str, tuple[list[float], list[float], list[int]]] = {
        "prefill_error": ([], [], []), "decode_error": ([], [], [])}
    nonfinite = 0
    try:
        # _renderable raises when no conversation fits, so there is a first prompt to probe
        k, capped = engine.cap_top_k(config.top_k, rendered[0][1])
        notes += [capped] if capped else []
        for index, (conversation, ids) in enumerate(rendered):
            row, found, bad = _answer(config, index, conversation, ids, engine, ref, ctl,
                                      tokenizer, k)
            rows.append(row)
            nonfinite += bad
            for name, (engine_err, control_err) in found.items():
                pairs[name][0].extend(engine_err)
                pairs[name][1].extend(control_err)
                pairs[name][2].extend([index] * len(engine_err))
            progress.update("conversations", index + 1, len(rendered),
                            detail=f"{conversation.id}: {row.where or 'identical'}")
    finally:
        client.close()
    laps.lap("conversations")
    comparisons = []
    for name, (engine_err, control_err, owner) in pairs.items():
        if engine_err:
            blocks = Blocks.build(torch.tensor(owner), torch.zeros(len(owner), dtype=torch.long),
                                  config.block_size)
            comparisons += ratios([name], torch.tensor(engine_err, dtype=torch.float64),
                                  torch.tensor(control_err, dtype=torch.float64), blocks,
                                  config.error_floor)
    return Result(
        **EngineVsControl.sides(inputs, engine.fingerprint),
        request={"temperature": 0, "max_tokens": config.new_tokens, "ignore_eos": True,
                 "logprobs": True, "top_logprobs": k},
        generation_defaults=generation_defaults(source),
        top_k=k, max_tie_gap=config.max_tie_gap, conversations=rows, comparisons=comparisons,
        nonfinite=nonfinite, notes=notes, timings=laps.timings)


def generation_defaults(source: str) -> dict:
    """The sampling fields of the checkpoint's generation_config.json that an engine applies to
    every request that does not set them (vLLM's --generation-config auto, its default)."""
    import json

    from day0.torchkit.evaltext import checkpoint_dir

    path = checkpoint_dir(source) / "generation_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    return {key: config[key] for key in SAMPLING_FIELDS if config.get(key) is not None}


def _renderable(tokenizer, chosen: list[Conversation], room: int,
                notes: list[str]) -> list[tuple[Conversation, list[int]]]:
    """(conversation, the checkpoint's prompt ids) of those this checkpoint can answer: a
    template without a chat template, refusing a conversation, without tools for a tool-call one,
    or a prompt leaving fewer than new_tokens of the context, leaves it out with a note."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ConfigError("the checkpoint has no chat template: the chat check has nothing to "
                          "compare", field="stages", fix="leave out the chat stage for a base "
                          "model (tokenizer_config.json chat_template or chat_template.jinja)")
    out = []
    for conversation in chosen:
        if conversation.tools and "tools" not in str(template):
            notes.append(f"'{conversation.id}' left out: the chat template renders no tools")
            continue
        try:
            ids = chat_ids(tokenizer, template_messages(conversation.messages),
                           conversation.tools)
        except Exception as exc:  # jinja's own errors, a template's raise_exception()
            notes.append(f"'{conversation.id}' left out: the chat template refuses it "
                         f"({type(exc).__name__}: {str(exc)[:120]})")
            continue
        if len(ids) > room:
            notes.append(f"'{conversation.id}' left out: {len(ids)} prompt tokens leave no room "
                         f"for the answer (at most {room})")
            continue
        out.append((conversation, ids))
    if not out:
        raise ConfigError("no conversation fits this checkpoint: " + "; ".join(notes)[:400],
                          field="conversations_file", fix="give shorter conversations")
    return out


def _answer(config: Config, index: int, conversation: Conversation, ids: list[int],
            engine: Engine, ref: Side, ctl: Side, tokenizer, k: int):
    """One conversation: its row, the paired per-token errors, the engine's non-finite count."""
    engine_prompt, chat = engine.chat_greedy(conversation.messages, conversation.tools,
                                             config.new_tokens, k)
    prefill, completion = engine.score_and_continue(ids, config.new_tokens, k)
    reference = ref.greedy([ids], config.new_tokens, k)[0]
    control = reference if ctl is ref else ctl.greedy([ids], config.new_tokens, k)[0]
    got = compare_greedy(reference, chat.steps, config.max_tie_gap)
    control_got = compare_greedy(reference, control, config.max_tie_gap)
    answer = [t for t, _ in chat.steps]
    prompt_matches = None if engine_prompt is None else engine_prompt == ids
    # decode on the checkpoint's own prompt ids (the completions path: paired whatever the
    # engine's template renders): its steps against one teacher-forced forward a side
    decoded = [t for t, _ in completion.steps]
    ref_lp = token_logprobs(ref, ids + decoded)
    ctl_lp = ref_lp if ctl is ref else token_logprobs(ctl, ids + decoded)
    n = len(ids)
    prefill_e = [abs(a - r) for a, r in zip(prefill.actual, ref_lp[:n - 1])]
    prefill_c = [abs(c - r) for c, r in zip(ctl_lp[:n - 1], ref_lp[:n - 1])]
    steps = [top.get(token, float("nan")) for token, top in completion.steps]
    decode_e = [abs(s - r) for s, r in zip(steps, ref_lp[n - 1:])]
    decode_c = [abs(c - r) for c, r in zip(ctl_lp[n - 1:], ref_lp[n - 1:])]
    found = {"prefill_error": (prefill_e, prefill_c), "decode_error": (decode_e, decode_c)}
    path_agrees = decoded == answer
    # temperature 0 picks the top raw logprob (vLLM returns raw logprobs): a step that does
    # not was shaped by other sampling parameters, e.g. a default repetition_penalty
    not_greedy = sum(1 for token, top in chat.steps
                     if top and top.get(token, float('-inf')) < max(top.values()) - TIE)
    where = _where(config, got, prompt_matches, path_agrees and not not_greedy, prefill_e,
                   prefill_c)
    at = got.first_difference

    def top(step_top: dict[int, float]) -> list[Top]:
        best = sorted(step_top.items(), key=lambda item: -item[1])[:TOP_SHOWN]
        return [Top(token=t, text=tokenizer.decode([t]), logprob=v) for t, v in best]

    row = ConversationRow(
        id=conversation.id, prompt_tokens=n, prompt_matches=prompt_matches,
        path_agrees=path_agrees, not_greedy_steps=not_greedy, tokens=got.tokens,
        close=got.close, first_difference=at,
        tie_gap=got.tie_gap, why=got.why, control_close=control_got.close,
        control_first_difference=control_got.first_difference, where=where,
        prefill_error=_mean(prefill_e), control_prefill_error=_mean(prefill_c),
        decode_error=_mean(decode_e), control_decode_error=_mean(decode_c),
        reference_text=tokenizer.decode([t for t, _ in reference]),
        engine_text=tokenizer.decode(answer),
        control_text=tokenizer.decode([t for t, _ in control]),
        engine_top=top(chat.steps[at][1]) if at is not None else [],
        reference_top=top(reference[at][1]) if at is not None else [],
        prefill_top=top(completion.steps[at][1]) if at is not None and at < len(
            completion.steps) else [])
    return row, found, chat.nonfinite + prefill.nonfinite + completion.nonfinite


def _where(config: Config, got, prompt_matches, greedy_path: bool, prefill_e: list[float],
           prefill_c: list[float]) -> str:
    """Where a conversation parts from the reference (the ConversationRow.where field);
    greedy_path: the chat answer is the completions answer and every step its own top-1."""
    if got.close:
        return "" if got.first_difference is None else "near-tie"
    if prompt_matches is False:
        return "prompt"
    if not greedy_path:
        return "request"
    if _mean(prefill_e) > config.prefill_ratio_diagnosis * max(_mean(prefill_c),
                                                               config.error_floor):
        return "prefill"
    return "decode"


__all__ = ["Config", "Result", "run"]
