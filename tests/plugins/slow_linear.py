"""A slower kernel, same numbers: every nn.Linear computes its product twice and keeps the second
(as a lost fused or vectorized matmul would). The kernel profile's baseline gates must catch it;
alignment must not see it."""

import torch


def apply(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            def twice(x, forward=module.forward):
                forward(x)
                return forward(x)

            module.forward = twice
