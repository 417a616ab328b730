"""The key/value cache argument of a transformers model's forward, under either of its names."""

from __future__ import annotations

import inspect


def cache_argument(model) -> str:
    """transformers 5.x calls the KV cache argument (and output) `cache`; older and remote code
    `past_key_values`, which 5.x still accepts with a deprecation warning until 5.40."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def returned_cache(output):
    """The cache a forward returned, whichever name its output carries it under."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


__all__ = ["cache_argument", "returned_cache"]
