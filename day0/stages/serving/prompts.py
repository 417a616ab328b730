"""The serving stage's fixed prompt set: token ids cut from the evaluation text.

Every prompt starts with the same ``shared_prefix`` tokens (the document's first tokens, after
the tokenizer's BOS/EOS start token) so a prefix cache can hit across prompts, then continues
with text from a different place of the evaluation text; lengths are spread evenly between
``shortest`` and ``longest`` so prompts end in different places of a KV-cache block and a
small chunked-prefill budget has to split them. Padding prompts (batching) are cut the same
way from text that no prompt uses.

The engine is sent token ids, never text: both sides of every comparison see exactly the same
input, whatever the engine's own tokenizer or chat template would do.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from day0.errors import ConfigError


class Prompt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(description="Position in the prompt set.")
    ids: list[int] = Field(repr=False, description="Token ids sent to the engine.")
    text_offset: int = Field(description="Where the prompt's own continuation starts in the "
                                         "tokenized text (after the shared prefix).")

    @property
    def length(self) -> int:
        return len(self.ids)


class PromptPlan(BaseModel):
    """The lengths the prompt set is cut with (what the report shows)."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(description="Prompts in the set.")
    shortest: int = Field(description="Tokens of the shortest prompt.")
    longest: int = Field(description="Tokens of the longest prompt.")
    shared_prefix: int = Field(description="Tokens every prompt starts with.")
    context: int = Field(description="The engine's context (max_model_len) the lengths fit in.")
    new_tokens: int = Field(description="Tokens generated per prompt.")
    text_tokens: int = Field(description="Tokens of the evaluation text.")
    text_file: str = Field(description="The evaluation text used.")


def plan_lengths(count: int, min_tokens: int, max_tokens: int, shared_prefix: int,
                 context: int, new_tokens: int) -> tuple[list[int], int]:
    """(prompt lengths, shared prefix) fitting the context: prompt + new tokens <= context.

    The configured lengths shrink to fit a small context; the shared prefix is kept at least
    one token shorter than the shortest prompt (each prompt has its own tokens)."""
    room = context - new_tokens
    if room < 2:
        raise ConfigError(f"new_tokens {new_tokens} leaves no room for a prompt in the engine's "
                          f"context of {context}", field="new_tokens",
                          fix=f"use new_tokens <= {max(1, context - 8)}")
    longest = min(max_tokens, room)
    shortest = min(min_tokens, longest)
    prefix = max(0, min(shared_prefix, shortest - 1))
    if count == 1:
        return [longest], prefix
    step = (longest - shortest) / (count - 1)
    return [round(shortest + i * step) for i in range(count)], prefix


def cut_prompts(ids: list[int], lengths: list[int], shared_prefix: int, start: int | None,
                padding: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """(prompts, padding prompts) cut from the text's token ids.

    start: a token prepended to each prompt (BOS/EOS as a document starts) or None. The
    shared prefix is the text's first tokens; each prompt's continuation and each padding
    prompt comes from its own stretch of the text after it (the text is walked in order and
    reused from the start of that stretch when it runs out)."""
    lead = [start] if start is not None else []
    head = (lead + ids)[:max(shared_prefix, len(lead))]
    first = len(head) - len(lead)          # the text's first token after the shared prefix
    rest = ids[first:]
    need = [n - len(head) for n in lengths] + [lengths[i % len(lengths)] - len(lead)
                                               for i in range(padding)]
    if min(need) < 1 or len(rest) < max(need):
        raise ConfigError(f"the evaluation text has {len(ids)} tokens; the prompt set needs at "
                          f"least {len(head) + max(need)} and prompts longer than the shared "
                          f"prefix of {len(head)}", field="text_file",
                          fix="give a longer text or use shorter prompts")
    out: list[Prompt] = []
    pads: list[Prompt] = []
    offset = 0
    for index, n in enumerate(need):
        if offset + n > len(rest):
            offset = 0  # the text ran out: walk it again from the start of its stretch
        piece, where = rest[offset:offset + n], first + offset
        offset += n
        if index < len(lengths):
            out.append(Prompt(index=index, ids=head + piece, text_offset=where))
        else:
            pads.append(Prompt(index=index, ids=lead + piece, text_offset=where))
    return out, pads


def common_prefix(sequences: list[list[int]]) -> int:
    """Tokens all sequences start with."""
    if not sequences:
        return 0
    n = 0
    for column in zip(*sequences):
        if any(v != column[0] for v in column):
            break
        n += 1
    return n


def build(source: str, text_file: str | None, *, count: int, min_tokens: int, max_tokens: int,
          shared_prefix: int, context: int, new_tokens: int, padding: int,
          trust_remote_code: bool = False) -> tuple[list[Prompt], list[Prompt], PromptPlan]:
    """The prompt set and the batching padding from the checkpoint's tokenizer."""
    from day0.torchkit import evaltext

    path = evaltext.resolve_text_file(text_file, source)
    tokenizer = evaltext.load_tokenizer(source, trust_remote_code=trust_remote_code)
    ids = evaltext.tokenize(tokenizer, evaltext.read_text(path))
    lengths, prefix = plan_lengths(count, min_tokens, max_tokens, shared_prefix, context,
                                   new_tokens)
    prompts, pads = cut_prompts(ids, lengths, prefix, evaltext.prefix_token(tokenizer), padding)
    plan = PromptPlan(count=len(prompts), shortest=min(lengths), longest=max(lengths),
                      shared_prefix=common_prefix([p.ids for p in prompts]), context=context, new_tokens=new_tokens,
                      text_tokens=len(ids), text_file=str(path))
    return prompts, pads, plan


__all__ = ["Prompt", "PromptPlan", "plan_lengths", "cut_prompts", "common_prefix", "build"]
