"""Fault (MoE): each token's top-1 and top-2 experts are exchanged; routing weights stay in rank order.

Models a ported top-k / sort kernel that returns expert indices in the wrong order: the top-1
routing weight goes to the second-choice expert and vice versa. Ranks are by routing weight (the
DeepSeek-V3 router returns its top-k unsorted). Applies to routers that return
(logits, weights, indices), e.g. Qwen3MoeTopKRouter and DeepseekV3TopkRouter in transformers 5.x.
"""

import torch


def _swap_top2(module, args, output):
    if not (isinstance(output, tuple) and len(output) == 3 and not output[2].is_floating_point()):
        raise ValueError(f"expert_swap: {type(module).__name__} does not return "
                         "(logits, weights, indices)")
    logits, weights, indices = output
    order = weights.argsort(dim=-1, descending=True)
    first, second = order[..., :1], order[..., 1:2]
    swapped = indices.clone()
    swapped.scatter_(-1, first, indices.gather(-1, second))
    swapped.scatter_(-1, second, indices.gather(-1, first))
    return logits, weights, swapped


def apply(model) -> None:
    routers = [m for m in model.modules()
               if type(m).__name__.lower().endswith("router") and isinstance(
                   getattr(m, "weight", None), torch.Tensor)]
    if not routers:
        raise ValueError("expert_swap: no MoE router found (dense model?)")
    if any(getattr(m, "top_k", 2) < 2 for m in routers):
        raise ValueError("expert_swap: the routers pick fewer than 2 experts per token")
    for router in routers:
        router.register_forward_hook(_swap_top2)
