"""Checkpoint sanity from headers alone: the analysis stage's share of day0.checkpoint.sanity.

Kept apart from day0.checkpoint.sanity (whose data-level checks read tensors with torch) so that header-only
work imports no torch (pyproject.toml's analysis-no-torch contract). The thresholds of every level
live in day0/data/sanity.yaml and are read here (:func:`limits`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from day0.checkpoint.headers import Checkpoint
from day0.errors import Problem

DATA_FILE = Path(__file__).parents[1] / "data" / "sanity.yaml"
REEXPORT = "re-download or re-export the checkpoint"


class HeaderLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_unused_fraction: float = Field(gt=0, le=1, description=(
        "Share of the checkpoint's parameters the model class does not use above which it is broken."))
    integer_dtypes: list[str] = Field(description="Stored dtypes that cannot hold a float parameter.")
    float_parameter: list[str] = Field(description=(
        "Regular expressions on a tensor name's last part for floating-point parameters (a "
        "weight or bias); other tensors may hold integers on purpose (routing tables)."))


class WeightLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    float_dtypes: list[str] = Field(description="safetensors dtypes whose values are checked.")
    chunk_elements: int = Field(ge=1, description="Most elements read from a tensor at once.")
    sample_elements: int = Field(ge=1, description="|w| sampled per tensor for its percentile.")
    extreme_ratio: float = Field(gt=1, description="max|w| over percentile |w| that only corruption gives.")
    extreme_floor: float = Field(gt=0, description="max|w| must also exceed this to count as extreme.")
    extreme_percentile: float = Field(gt=0, lt=1, description="The percentile of |w| compared with.")
    percentile_min_above: int = Field(ge=1, description=(
        "Largest |w| always left above the percentile (small tensors)."))
    additive: list[str] = Field(description=(
        "Regular expressions on a tensor name's last part for tensors added, not multiplied "
        "(biases at any rank): never all-zero or constant findings."))
    max_named: int = Field(ge=1, description="Tensors named per message before 'and N more'.")


class PerplexityLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_uniform_ratio: float = Field(gt=0, description="Perplexity / vocab size above this: near uniform.")
    max_stored_ratio: float = Field(gt=1, description="Perplexity / stored score above this: broken.")


class Limits(BaseModel):
    """day0/data/sanity.yaml."""

    model_config = ConfigDict(extra="forbid")

    header: HeaderLimits = Field(description="Header-level checks (analysis stage).")
    weights: WeightLimits = Field(description="Data-level checks (check_weights).")
    perplexity: PerplexityLimits = Field(description="Reference perplexity checks.")


@lru_cache(maxsize=1)
def limits() -> Limits:
    from day0.yamlio import load_model, read_mapping

    return load_model(Limits, read_mapping(DATA_FILE), str(DATA_FILE))


def _names(names: list[str]) -> str:
    """At most max_named names, then 'and N more' (messages stay one readable line)."""
    cap = limits().weights.max_named
    shown = ", ".join(names[:cap])
    return shown + (f" and {len(names) - cap} more" if len(names) > cap else "")


# --------------------------------------------------------------------------- headers

def header_problems(ckpt: Checkpoint) -> list[str]:
    """Broken-checkpoint findings from headers and the tensors' roles (day0.checkpoint.headers.classify
    by header-only rules, or day0.checkpoint.match against transformers' class; without roles
    the unused share is unknown and not judged)."""
    lim = limits().header
    problems: list[str] = []
    used, unused = ckpt.params("model"), ckpt.params("extra")
    if ckpt.roles and used + unused and unused / (used + unused) > lim.max_unused_fraction:
        layers = ckpt.config.get("num_hidden_layers")
        problems.append(str(Problem(
            f"{unused / (used + unused):.0%} of the checkpoint's parameters ({unused:,} of "
            f"{used + unused:,}) are not used by {ckpt.model_class or 'the model class'} "
            f"(num_hidden_layers={layers})", file=ckpt.config_file, field="num_hidden_layers",
            fix="correct config.json to describe the weights, or remove the unused tensors")))
    if not ckpt.config.get("quantization_config"):  # quantized exports store ints on purpose
        relabelled: dict[str, list[str]] = defaultdict(list)
        for name, info in sorted(ckpt.tensors.items()):
            leaf = name.rpartition(".")[2]
            if (ckpt.roles.get(name) == "model" and info.dtype in lim.integer_dtypes
                    and any(re.search(p, leaf) for p in lim.float_parameter)):
                relabelled[info.dtype].append(name)
        for dtype, names in sorted(relabelled.items()):
            first = ckpt.tensors[names[0]]
            problems.append(str(Problem(
                f"{len(names)} floating-point parameter(s) stored as integer dtype {dtype}: "
                f"{_names(names)} (transformers would load the integers as weights)",
                file=ckpt.location(first.file), field=names[0],
                fix=f"{REEXPORT} with the dtype config.json declares")))
    return problems


__all__ = ["header_problems", "limits", "Limits", "REEXPORT", "DATA_FILE"]
