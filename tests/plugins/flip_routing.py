"""Fault (MoE): negate every router's weight so top-k picks the LEAST likely experts.

Routers are found by class name (…Router, …Gate, e.g. Qwen3MoeTopKRouter, DeepseekV3TopkRouter,
MixtralTopKRouter) holding a 2-D ``weight`` [num_experts, hidden].
"""

import torch


def routers(model):
    for name, module in model.named_modules():
        cls = type(module).__name__.lower()
        weight = getattr(module, "weight", None)
        if (cls.endswith("router") or cls.endswith("gate")) and isinstance(weight, torch.Tensor) \
                and weight.dim() == 2:
            yield name, module


def apply(model) -> None:
    found = list(routers(model))
    if not found:
        raise ValueError("flip_routing: no router modules found (is this an MoE model?)")
    with torch.no_grad():
        for _, module in found:
            module.weight.neg_()
