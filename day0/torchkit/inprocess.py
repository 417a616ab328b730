"""The in-process sides: the reference (float32) and the control (the same transformers
implementation at the target's dtype), both on the reference device (cpu)."""

from __future__ import annotations

from typing import Iterator

import torch

from day0.engines.greedy import Step
from day0.torchkit.kvcache import cache_argument


class Side:
    """One in-process model: next-token log-probabilities of windows, greedy continuations."""

    def __init__(self, name: str, model, device: str):
        self.name, self.model, self.device = name, model, device

    def logits(self, ids: list[int], chunk: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(start, [positions, vocab] float32 CPU next-token logits) of a window, chunk by
        chunk over a KV cache when it is longer than `chunk` (bounds the memory of a long
        window: a chunk's activations and logits, never the window's)."""
        from transformers import DynamicCache

        x = torch.tensor([ids], device=self.device)
        cache = DynamicCache(config=self.model.config) if len(ids) > chunk else None
        cache_kw = {} if cache is None else {cache_argument(self.model): cache}
        for start in range(0, len(ids), chunk):
            end = min(start + chunk, len(ids))
            with torch.no_grad():
                out = self.model(input_ids=x[:, start:end], use_cache=cache is not None,
                                 position_ids=torch.arange(start, end, device=self.device)[None],
                                 **cache_kw)
            yield start, out.logits[0].to("cpu", torch.float32)

    def greedy(self, prompts: list[list[int]], new_tokens: int, k: int) -> list[list[Step]]:
        """Greedy continuations of equal-length prompts (one batch, no padding), exactly
        new_tokens each, EOS not special; per step the chosen token and the top-k logprobs of
        the raw logits (what the engine returns with its default raw logprobs)."""
        from transformers import DynamicCache

        ids = torch.tensor(prompts, device=self.device)
        cache = DynamicCache(config=self.model.config)
        cache_kw = {cache_argument(self.model): cache}
        steps: list[list[Step]] = [[] for _ in prompts]
        length = ids.shape[1]
        with torch.no_grad():
            out = self.model(input_ids=ids, use_cache=True,
                             position_ids=torch.arange(length, device=self.device)[None]
                             .expand(len(prompts), -1), **cache_kw)
            for step in range(new_tokens):
                logp = torch.log_softmax(out.logits[:, -1].to("cpu", torch.float64), dim=-1)
                chosen = logp.argmax(-1)
                values, indices = logp.topk(min(k, logp.shape[-1]), dim=-1)
                for row in range(len(prompts)):
                    steps[row].append((int(chosen[row]), dict(zip(indices[row].tolist(),
                                                                  values[row].tolist()))))
                if step + 1 == new_tokens:
                    break
                position = torch.full((len(prompts), 1), length + step, device=self.device)
                out = self.model(input_ids=chosen[:, None].to(self.device), use_cache=True,
                                 position_ids=position, **cache_kw)
        return steps


def load_sides(source: str, inputs) -> tuple[Side, Side]:
    """(reference, control) in process for a stage's inputs (day0.execution.contract
    StageInputs); the control is the reference itself when the target's dtype is the
    reference's."""
    from day0.checkpoint.modeling import load_pretrained
    from day0.execution import progress

    target, reference = inputs.target, inputs.reference
    progress.update("models", 0, 2, detail="loading the reference")
    ref = Side("reference", load_pretrained(source, device=reference.device,
                                            dtype=reference.dtype,
                                            trust_remote_code=inputs.trust_remote_code),
               reference.device)
    progress.update("models", 1, 2, detail="reference loaded")
    ctl = ref if target.dtype == reference.dtype else Side(
        "control", load_pretrained(source, device=reference.device, dtype=target.dtype,
                                   trust_remote_code=inputs.trust_remote_code),
        reference.device)
    progress.update("models", 2, 2, detail="control loaded")
    return ref, ctl


def token_logprobs(side: Side, ids: list[int], chunk: int = 1024) -> list[float]:
    """Teacher-forced: the side's logprob of ids[i] given ids[:i], for i = 1..len(ids) - 1."""
    out: list[float] = []
    for start, logits in side.logits(ids, chunk):
        logp = torch.log_softmax(logits.double(), dim=-1)
        rows = range(start, start + logp.shape[0])
        out += [float(logp[r - start, ids[r + 1]]) for r in rows if r + 1 < len(ids)]
    return out


__all__ = ["Side", "load_sides", "token_logprobs"]
