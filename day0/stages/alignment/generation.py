"""Greedy generation on both sides from the same prompts: token match and first divergence."""

from __future__ import annotations

import torch
from pydantic import Field

from day0.contract import Row


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
