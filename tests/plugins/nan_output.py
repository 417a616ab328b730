"""Fault: the last decoder layer outputs NaN at every position (a broken kernel)."""

import torch

from day0.checkpoint.modeling import decoder_layers


def layer_output(output):
    """The hidden-states tensor of a decoder layer's output (tensor or tuple)."""
    return output[0] if isinstance(output, tuple) else output


def replace_output(output, hidden):
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden



def _hook(module, args, output):
    hidden = layer_output(output)
    return replace_output(output, torch.full_like(hidden, float("nan")))


def apply(model) -> None:
    decoder_layers(model)[-1].register_forward_hook(_hook)
