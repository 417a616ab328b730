"""Dtype names (a target's ``dtype``, a stage setting) as torch dtypes: the one conversion."""

from __future__ import annotations

import torch

from day0.errors import ConfigError

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the short spellings of other tools (vLLM's --dtype, bench scripts)
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a name means; ConfigError naming the valid choices for any other."""
    found = TORCH_DTYPES.get(ALIASES.get(name, name))
    if found is None:
        raise ConfigError(f"unknown dtype {name!r}", field="dtype",
                          fix=f"use one of {', '.join(TORCH_DTYPES)} "
                              f"(or {', '.join(ALIASES)})")
    return found


__all__ = ["TORCH_DTYPES", "ALIASES", "torch_dtype"]
