"""Quantized deployment: int4 weights, symmetric, group size 32 along the input dim (fake-quantized).

Every matmul weight inside the decoder layers (Linear weights and fused MoE expert tensors) is
rounded to 4 bits per group of 32 inputs and dequantized in place; embeddings, lm_head, norms and
routers stay as they are (a W4A16 g32 deployment). Far from bf16: every gate must see it.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fake_quant.py sits next to this file
from fake_quant import fake_quantize, matmul_weights  # noqa: E402

GROUP = 32


def apply(model) -> None:
    with torch.no_grad():
        for _, param in matmul_weights(model):
            param.copy_(fake_quantize(param, bits=4, group=GROUP))
