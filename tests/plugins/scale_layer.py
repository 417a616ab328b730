"""Fault: one decoder layer's output hidden states are multiplied by (1 + DAY0_SCALE), default 5 %.

Models a kernel with a slightly wrong constant (a mis-scaled residual add, a norm weight applied
twice in one block). Layer: env DAY0_SCALE_LAYER (default the middle layer, clamped to the last).
"""

import os

from day0.checkpoint.modeling import decoder_layers


def _hook(factor: float):
    def hook(module, args, output):
        if isinstance(output, tuple):  # older decoder layers return (hidden, ...)
            return (output[0] * factor, *output[1:])
        return output * factor
    return hook


def apply(model) -> None:
    layers = decoder_layers(model)
    index = min(int(os.environ.get("DAY0_SCALE_LAYER") or len(layers) // 2), len(layers) - 1)
    factor = 1.0 + float(os.environ.get("DAY0_SCALE") or 0.05)
    model.day0_scaled_layer = index  # lets tests and reports read back which layer was hit
    layers[index].register_forward_hook(_hook(factor))
