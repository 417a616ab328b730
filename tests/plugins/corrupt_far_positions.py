"""Fault: corrupt hidden states only at positions >= 75% of max_position_embeddings.

A check that only runs short prompts sees a perfect model; evaluation windows that reach the
trained context length must catch it. Applied to the middle decoder layer.
"""

import torch

from day0.checkpoint.modeling import decoder_layers


def layer_output(output):
    """The hidden-states tensor of a decoder layer's output (tensor or tuple)."""
    return output[0] if isinstance(output, tuple) else output


def replace_output(output, hidden):
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


FRACTION = 0.75
SCALE = 0.5


def _make_hook(start: int):
    def hook(module, args, kwargs, output):
        hidden = layer_output(output)
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(hidden.shape[-2], device=hidden.device)
        far = (positions.reshape(-1, hidden.shape[-2])[0] >= start).to(hidden.device)
        if not bool(far.any()):
            return output
        gen = torch.Generator().manual_seed(99)
        noise = torch.randn(hidden.shape, generator=gen).to(hidden.device, hidden.dtype)
        rms = hidden.float().pow(2).mean().sqrt().to(hidden.dtype)
        mask = far.view(*([1] * (hidden.dim() - 2)), -1, 1).to(hidden.dtype)
        return replace_output(output, hidden + SCALE * rms * noise * mask)
    return hook


def apply(model) -> None:
    start = int(FRACTION * model.config.max_position_embeddings)
    layers = decoder_layers(model)
    model.day0_corrupt_from_position = start
    layers[len(layers) // 2].register_forward_hook(_make_hook(start), with_kwargs=True)
