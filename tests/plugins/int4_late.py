"""Fault: int4 g32 weights, but only for tokens at positions >= 0.75 x max_position_embeddings.

Models a kernel that is right on short prompts and wrong deep into the context (a long-context
code path, a KV-cache page boundary). Checks that stop short of the trained context see a clean
model. Positions are the decoder layers' `position_ids` (absolute, also for KV-cached chunks),
else `cache_position`, else 0..seq-1. Each affected module computes its clean and its quantized
output and keeps the quantized one only at the late positions.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fake_quant.py sits next to this file
from fake_quant import fake_quantize, matmul_weights  # noqa: E402

from day0.checkpoint.modeling import decoder_layers

FRACTION = 0.75
GROUP = 32


def _capture(state: dict):
    def pre_hook(module, args, kwargs):
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = kwargs.get("cache_position")
        if positions is None:
            hidden = args[0] if args else kwargs["hidden_states"]
            positions = torch.arange(hidden.shape[-2], device=hidden.device)
        state["positions"] = positions
    return pre_hook


def _late(state: dict, pairs: list, start: int):
    def hook(module, args, kwargs, output):
        positions = state["positions"]
        seq = positions.shape[-1]
        late = positions.reshape(-1, seq) >= start
        if not bool(late.any()):
            return output
        tokens = output.shape[:-1].numel()  # [batch, seq, out] or flattened [batch*seq, out]
        late = late.expand(tokens // seq, seq).reshape(output.shape[:-1]).unsqueeze(-1)
        clean = [param.data for param, _ in pairs]
        try:
            for param, quant in pairs:
                param.data = quant
            quantized = module.forward(*args, **kwargs)  # forward, not __call__: no hook recursion
        finally:
            for (param, _), data in zip(pairs, clean):
                param.data = data
        return torch.where(late.to(output.device), quantized, output)
    return hook


def apply(model) -> None:
    start = int(FRACTION * model.config.max_position_embeddings)
    state: dict = {"positions": None}
    owners: dict = {}
    for module, param in matmul_weights(model):
        owners.setdefault(module, []).append((param, fake_quantize(param, bits=4, group=GROUP)))
    for layer in decoder_layers(model):
        layer.register_forward_pre_hook(_capture(state), with_kwargs=True)
    for module, pairs in owners.items():
        module.register_forward_hook(_late(state, pairs, start), with_kwargs=True)
    model.day0_quantized_from_position = start
