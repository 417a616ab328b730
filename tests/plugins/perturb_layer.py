"""Fault: add noise (20% of the hidden-state RMS) to the output of ONE decoder layer.

Layer index: env DAY0_PERTURB_LAYER (default 2, clamped to the last layer). The alignment stage
must name this layer as the first divergent one.
"""

import os

import torch

from day0.checkpoint.modeling import decoder_layers


def layer_output(output):
    """The hidden-states tensor of a decoder layer's output (tensor or tuple)."""
    return output[0] if isinstance(output, tuple) else output


def replace_output(output, hidden):
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


SCALE = 0.2


def _hook(module, args, output):
    hidden = layer_output(output)
    gen = torch.Generator().manual_seed(1234)  # same noise every call: deterministic checks
    noise = torch.randn(hidden.shape, generator=gen, dtype=torch.float32)
    rms = hidden.float().pow(2).mean().sqrt()
    noisy = hidden + (SCALE * rms * noise).to(hidden.device, hidden.dtype)
    return replace_output(output, noisy)


def apply(model) -> None:
    layers = decoder_layers(model)
    index = min(int(os.environ.get("DAY0_PERTURB_LAYER", "2")), len(layers) - 1)
    model.day0_perturbed_layer = index  # lets tests read back which layer was hit
    layers[index].register_forward_hook(_hook)
