"""Shared by the quantization plugins (int8_weights, int4_weights, int4_late); not a plugin itself
(no apply). They load it from their own folder, so it must sit next to them."""

import torch
import torch.nn.functional as F

from day0.checkpoint.modeling import decoder_layers


def fake_quantize(weight: torch.Tensor, bits: int, group: int | None = None) -> torch.Tensor:
    """Symmetric round-to-nearest along the input (last) dim: per output channel, or per group."""
    w = weight.detach().float()
    cols = w.shape[-1]
    group = group or cols
    w = F.pad(w, (0, -cols % group))  # a ragged last group is padded with zeros, then cut off
    blocks = w.reshape(*w.shape[:-1], -1, group)
    qmax = 2 ** (bits - 1) - 1
    scale = blocks.abs().amax(-1, keepdim=True).clamp(min=1e-12) / qmax
    quant = (blocks / scale).round().clamp(-qmax, qmax) * scale
    return quant.reshape(w.shape)[..., :cols].to(weight.dtype)


def matmul_weights(model):
    """Every >= 2-D parameter of the decoder layers except routers' (kept at full precision)."""
    for layer in decoder_layers(model):
        for module in layer.modules():
            if type(module).__name__.lower().endswith("router"):
                continue
            for param in module.parameters(recurse=False):
                if param.dim() >= 2:
                    yield module, param
