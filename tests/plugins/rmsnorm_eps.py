"""Fault: every RMSNorm uses a wrong epsilon (env DAY0_RMSNORM_EPS, default 1e-2).

Models a ported norm kernel that hard-codes eps or reads the wrong config field (checkpoints use
1e-5 or 1e-6). Norms are found by class name (...RMSNorm); transformers stores eps as
`variance_epsilon` (Llama, Qwen3-MoE, DeepSeek-V3), torch.nn.RMSNorm as `eps`.
"""

import os


def apply(model) -> None:
    eps = float(os.environ.get("DAY0_RMSNORM_EPS") or 1e-2)
    changed = 0
    for module in model.modules():
        if not type(module).__name__.lower().endswith("rmsnorm"):
            continue
        for attr in ("variance_epsilon", "eps"):
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, eps)
                changed += 1
    if not changed:
        raise ValueError("rmsnorm_eps: no RMSNorm module with variance_epsilon or eps found")
