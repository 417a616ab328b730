"""The chat part of report.md, its findings and tables (from the result as JSON)."""

from __future__ import annotations

from day0.rendering.tables import cell, table

DEFINITIONS = """\
How to read this (every side answers the same conversations greedily, EOS ignored):
- *engine*: `/v1/chat/completions`, the engine's own template and request defaults; \
*control*: the checkpoint at the target's dtype in process; *reference*: float32.
- *close*: equal up to the first differing token, where each side's token is in the other's \
top-k and each side's margin between the two is at most the near-tie bound (vLLM's \
check_logprobs_close, plus the bound). *near-tie*: close, parted there.
- *where* (not close): *prompt* the engine rendered other prompt ids; *request* its chat \
answer differs from its completions answer on the checkpoint's ids, or picks tokens below its \
own top-1 at temperature 0 (*not greedy* steps: request defaults such as a repetition \
penalty); *prefill* its prompt logprobs are off; *decode* the prompt is fine, the answer's \
steps are not.
- *prefill / decode error*: mean |logprob - reference logprob| of the prompt's tokens \
(`prompt_logprobs`) / of the engine's answer tokens (its step logprobs against the reference's \
teacher-forced ones); the control's over the same tokens.
"""


def _tops(tops: list[dict] | None) -> str:
    return ", ".join(f"{t.get('text')!r} {cell(t.get('logprob'), 3)}" for t in tops or [])


def markdown(c: dict, gates: list | None = None) -> str:
    """report.md's chat section."""
    if not c or "conversations" not in c:
        return ""
    parts = ["## Chat: the engine's answers vs the checkpoint's\n",
             f"- target: {c.get('target')}; engine: {c.get('engine')} "
             f"({cell(c.get('engine_fingerprint'))}); control: {c.get('control')}",
             f"- request: {c.get('request')}; top-k {cell(c.get('top_k'))}; near-tie bound "
             f"{cell(c.get('max_tie_gap'))} nats; non-finite logprobs {cell(c.get('nonfinite'))}",
             "- request defaults in generation_config.json (an engine such as vLLM applies them "
             f"to every request that does not set them): {c.get('generation_defaults') or 'none'}"]
    parts += [f"- note: {n}" for n in c.get("notes") or []]
    parts += ["", DEFINITIONS, table(
        ["comparison", "engine", "control", "ratio", "low", "tokens"],
        [[x.get("metric"), x.get("target"), x.get("control"), x.get("ratio"), x.get("low"),
          x.get("positions")] for x in c.get("comparisons") or []])]
    parts += ["### Conversations\n", table(
        ["conversation", "close", "where", "first difference", "control close", "prompt ids",
         "chat = completions", "not greedy", "prefill error", "decode error", "reference",
         "engine"],
        [[r.get("id"), r.get("close"), r.get("where") or "identical", r.get("first_difference"),
          r.get("control_close"), r.get("prompt_matches"), r.get("path_agrees"),
          r.get("not_greedy_steps"),
          r.get("prefill_error"), r.get("decode_error"), (r.get("reference_text") or "")[:50],
          (r.get("engine_text") or "")[:50]] for r in c.get("conversations") or []])]
    parted = [r for r in c.get("conversations") or [] if r.get("first_difference") is not None]
    if parted:
        parts += ["### At the first difference\n", table(
            ["conversation", "position", "engine top-k", "reference top-k",
             "engine, completions path", "why"],
            [[r.get("id"), r.get("first_difference"), _tops(r.get("engine_top")),
              _tops(r.get("reference_top")), _tops(r.get("prefill_top")), r.get("why") or ""]
             for r in parted])]
    return "\n".join(parts)


def findings(c: dict) -> list[str]:
    """One line per conversation that is not close: where it parts and both sides' top tokens."""
    out = []
    for r in c.get("conversations") or []:
        if r.get("close"):
            continue
        engine, ref = (r.get("engine_top") or [{}])[0], (r.get("reference_top") or [{}])[0]
        out.append(f"chat '{r.get('id')}' parts from the reference at answer token "
                   f"{r.get('first_difference')} ({r.get('where')}): engine "
                   f"{engine.get('text')!r} {cell(engine.get('logprob'), 3)}, reference "
                   f"{ref.get('text')!r} {cell(ref.get('logprob'), 3)}")
    if isinstance(c.get("nonfinite"), (int, float)) and c["nonfinite"] > 0:
        out.append(f"the engine returned {c['nonfinite']} non-finite logprobs in chat")
    return out


def tables(c: dict) -> dict:
    """Prefect table artifact: one row per conversation."""
    rows = [{"conversation": r.get("id"), "close": cell(r.get("close")),
             "where": r.get("where") or "identical",
             "first difference": cell(r.get("first_difference")),
             "control close": cell(r.get("control_close")),
             "prefill error": cell(r.get("prefill_error"), 4),
             "decode error": cell(r.get("decode_error"), 4),
             "engine answer": (r.get("engine_text") or "")[:60]}
            for r in c.get("conversations") or []]
    return {"day0-chat-conversations": ("Greedy chat answers, engine vs the checkpoint, per "
                                        "conversation", rows)} if rows else {}


__all__ = ["markdown", "findings", "tables", "DEFINITIONS"]
