"""Quantized deployment: int8 weights, symmetric, one scale per output channel (fake-quantized).

Every matmul weight inside the decoder layers (Linear weights and fused MoE expert tensors) is
rounded to 8 bits and dequantized in place; embeddings, lm_head, norms and routers stay as they
are, as in common W8 deployments. Not bit-faithful: a gate profile for quantized targets, not the
bf16 one, decides whether it passes.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fake_quant.py sits next to this file
from fake_quant import fake_quantize, matmul_weights  # noqa: E402


def apply(model) -> None:
    with torch.no_grad():
        for _, param in matmul_weights(model):
            param.copy_(fake_quantize(param, bits=8))
