"""Greedy generation on both sides from the same prompts: token match and first divergence."""

from __future__ import annotations

import torch
from pydantic import Field

from day0.execution.contract import Row


class GenerationRow(Row):
    prompt_start: int = Field(description="Token offset of the prompt in the evaluation text.")
    prompt_tokens: int = Field(description="Prompt length, tokens.")
    new_tokens: int = Field(description="Tokens requested.")
    match_rate: float = Field(description="Fraction of generated positions with the same token.")
    first_divergence: int = Field(description="First differing generated position "
                                              "(= new_tokens when identical).")
    control_match_rate: float = Field(0.0, description="The control's match rate, same prompt.")
    reference_text: str = Field(description="Reference continuation (decoded).")
    target_text: str = Field(description="Target continuation (decoded).")
    control_text: str = Field("", description="Control continuation (decoded).")


def greedy(model, prompts: list[list[int]], new_tokens: int, device: str, pad_id: int | None
           ) -> list[list[int]]:
    """Greedy continuations of equal-length prompts, generated as one batch (no padding)."""
    ids = torch.tensor(prompts, device=device)
    with torch.no_grad():
        # min_new_tokens: both sides produce exactly new_tokens, so an early EOS on one side
        # cannot hide or fake a difference.
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             do_sample=False, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=pad_id,
                             num_beams=1, temperature=None, top_p=None, top_k=None)
    return out[:, ids.shape[1]:].tolist()


def compare(ref: list[int], tgt: list[int], new_tokens: int) -> tuple[float, int]:
    """Match rate over new_tokens positions (a missing token is a mismatch), first divergence."""
    matches = sum(1 for i in range(new_tokens)
                  if i < len(ref) and i < len(tgt) and ref[i] == tgt[i])
    first = next((i for i in range(new_tokens)
                  if i >= len(ref) or i >= len(tgt) or ref[i] != tgt[i]), new_tokens)
    return matches / new_tokens if new_tokens else 1.0, first


def compared(new_tokens: int, chosen, batch, tokenizer, ref, ctl, tgt, ref_device: str, target,
             kept_greedy, streamed: bool, made: dict,
             notes: list[str] | None = None) -> list[GenerationRow]:
    """Greedy continuations of reference, control (banked or generated) and target, compared;
    made collects the ones generated for the bank (by part). kept_greedy: core.KeptSides'.
    A reference implementation that cannot generate at all (transformers' own decoding path
    raises for this architecture, e.g. a hybrid cache with no attention layer) compares none:
    a note, its metrics missing (the generation gate, a warning, says so)."""
    from transformers.utils import logging as hf_logging

    from day0.execution import progress
    from day0.errors import TargetFault
    from day0.stages.alignment.banked import BankSide, Recorder
    from day0.stages.alignment.streamed import streamed_greedy

    if not chosen:
        return []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generate = streamed_greedy if streamed else kept_greedy or greedy
    total = 1 + (ctl is not ref) + (tgt is not None)
    what = f"{len(batch)} prompts x {new_tokens} tokens"

    def continuations(side, done: int):
        if isinstance(side, BankSide):
            found = side.bank.meta.generations
            if found is None:  # its live run could not generate either
                raise RuntimeError(f"the reference bank's {side.name} part holds no generations")
        else:
            found = generate(side.model, batch, new_tokens, ref_device, pad)
            if isinstance(side, Recorder):
                made[side.writer.part] = found
        progress.update("generation", done, total, detail=f"{what}: {side.name} done")
        return found

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        try:
            refs = continuations(ref, 1)
            ctls = refs if ctl is ref else continuations(ctl, 2)
        except Exception as exc:  # the reference's own code: nothing to compare the target with
            if notes is not None:
                notes.append(f"generation not compared: the reference implementation's "
                             f"generate() raised {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
            return []
        try:
            tgts = ctls if tgt is None else (streamed_greedy if streamed else greedy)(
                tgt.model, batch, new_tokens, target.device, pad)
        except Exception as exc:
            raise TargetFault(f"target generate() raised {type(exc).__name__}: {exc}",
                             field="target.plugins" if target.plugins else "target",
                             fix="fix the target's kernels/plugins (cached decoding path)"
                             ) from exc
    finally:
        hf_logging.set_verbosity(previous)
    rows = []
    for (start, prompt), r, c, t in zip(chosen, refs, ctls, tgts):
        rate, first = compare(r, t, new_tokens)
        control_rate, _ = compare(r, c, new_tokens)
        rows.append(GenerationRow(
            prompt_start=start, prompt_tokens=len(prompt), new_tokens=new_tokens,
            match_rate=rate, first_divergence=first, control_match_rate=control_rate,
            reference_text=tokenizer.decode(r), target_text=tokenizer.decode(t),
            control_text=tokenizer.decode(c)))
    return rows
