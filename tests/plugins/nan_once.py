"""Fault: a single NaN, once: one element of one decoder layer's output, first forward only.

Models a transient kernel glitch (a race, an uninitialised read) that a later, clean forward
hides. Layer: env DAY0_NAN_LAYER (default the middle layer); element: hidden feature 0 at the
middle position of the sequence. Attention carries it to every later position (and into the KV
cache), as a real one would; PyTorch's CPU attention even to earlier ones (NaN keys under the
causal mask).
"""

import os

from day0.checkpoint.modeling import decoder_layers


def _hook(state: dict):
    def hook(module, args, output):
        if state["fired"]:
            return output
        state["fired"] = True
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        hidden[..., hidden.shape[-2] // 2, 0] = float("nan")
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
    return hook


def apply(model) -> None:
    layers = decoder_layers(model)
    index = min(int(os.environ.get("DAY0_NAN_LAYER") or len(layers) // 2), len(layers) - 1)
    model.day0_nan_layer = index
    layers[index].register_forward_hook(_hook({"fired": False}))
