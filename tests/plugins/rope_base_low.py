"""Fault: RoPE base (theta) 10 % low in every rotary embedding.

Models a port that reads the wrong rope_theta (a default instead of the checkpoint's value) or
precomputes its sin/cos tables with a wrong base. Each rotary module's inv_freq (and
original_inv_freq, attention_scaling) is recomputed exactly as transformers does in its
__init__ (default rope or ROPE_INIT_FUNCTIONS[rope_type], e.g. DeepSeek-V3's yarn) from a copy of
the config whose rope_theta is 0.9x.
"""

import copy

import torch

FACTOR = 0.9


def _rope_parameters(module, theta_factor: float):
    """inv_freq and attention scaling of module for a config with rope_theta scaled."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = copy.deepcopy(module.config)  # the model's own config stays untouched
    params = config.rope_parameters
    if not isinstance(params, dict) or "rope_theta" not in params:
        raise ValueError(f"rope_base_low: {type(module).__name__} has per-layer-type or "
                         "missing rope_parameters; not supported")
    params["rope_theta"] = params["rope_theta"] * theta_factor
    rope_type = module.rope_type
    init = module.compute_default_rope_parameters if rope_type == "default" \
        else ROPE_INIT_FUNCTIONS[rope_type]
    return init(config)  # as the module's __init__ calls it


def apply(model) -> None:
    rotaries = [m for m in model.modules()
                if isinstance(getattr(m, "inv_freq", None), torch.Tensor) and hasattr(m, "config")]
    if not rotaries:
        raise ValueError("rope_base_low: no rotary embedding module (inv_freq buffer) found")
    for module in rotaries:
        inv_freq, scaling = _rope_parameters(module, FACTOR)
        inv_freq = inv_freq.to(module.inv_freq.device, module.inv_freq.dtype)
        module.inv_freq = inv_freq  # a registered buffer: assignment keeps it a buffer
        if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
            module.original_inv_freq = inv_freq.clone()  # dynamic rope types restart from it
        module.attention_scaling = scaling
