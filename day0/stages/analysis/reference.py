"""Before anything runs: what the alignment stage's reference costs for this checkpoint.

Resident, the float32 reference and the control at the target's dtype are in memory at once.
Streamed, one layer is (the largest decoder layer's non-expert weights in float32, plus one
group of routed experts), with the embedding rows present, one block of the head, and the
activations of one window. Time is per pass over the weights (every streamed forward reads each
weight once per side) plus compute per position. Coefficients: day0/data/streaming.yaml,
measured on the development machine; another worker scales them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from day0.yamlio import read_mapping

COEFFICIENTS = Path(__file__).resolve().parents[2] / "data" / "streaming.yaml"
GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_LAYER = re.compile(r"\.layers\.(\d+)\.")


class ReferenceEstimate(BaseModel):
    """The alignment stage's reference and control: resident vs streamed, estimated."""

    model_config = ConfigDict(extra="forbid")

    resident_gib: float = Field(description=(
        "Reference (float32) and control (target dtype) in memory, with slack."))
    available_gib: float | None = Field(None, description="Memory available on this host now.")
    mode: Literal["resident", "streamed"] = Field(description=(
        "What alignment.streaming: auto chooses here."))
    streamed_peak_gib: float = Field(description=(
        "Streamed peak: largest layer (float32) + expert group + head block + one window's "
        "activations + fixed."))
    largest_layer_params: int = Field(description="Non-expert parameters of the largest layer.")
    pass_seconds: float = Field(description=(
        "One streamed forward's reads (reference and control): every weight once per side."))
    seconds_per_1k_positions: float = Field(description=(
        "Compute per 1000 positions on both sides (2 x active params per position)."))
    bank_mib_per_1k_positions: float = Field(0.0, description=(
        "Reference bank per 1000 evaluation positions: float32 logits and every layer's "
        "output (reference) plus the control's at its dtype (alignment.reference_bank)."))
    basis: str = Field(description="Where the figures come from.")


def estimate(tensors: list[tuple[str, tuple[int, ...]]], *, active_params: int, hidden: int,
             vocab: int | None, target_dtype: str, intermediate: int | None,
             available_gib: float | None) -> ReferenceEstimate:
    c = read_mapping(COEFFICIENTS)
    sizes = [(name, math.prod(shape)) for name, shape in tensors]
    total = sum(n for _, n in sizes)
    sides = [4, BYTES.get(target_dtype, 2)] if target_dtype != "float32" else [4]
    resident = total * sum(sides) * c["resident_slack"] / GIB
    per_layer: dict[int, int] = {}
    for name, n in sizes:
        found = _LAYER.search(name)
        if found and ".experts." not in name:
            per_layer[int(found.group(1))] = per_layer.get(int(found.group(1)), 0) + n
    largest = max(per_layer.values(), default=0)
    has_experts = any(".experts." in name for name, _ in sizes)
    window = c["window_positions"]
    activations = (window * hidden * 4 * len(sides) * 2          # hidden states kept, two live
                   + window * (intermediate or 4 * hidden) * 4 * 3  # MLP temporaries
                   + c["logit_chunk_positions"] * (vocab or 0) * 4 * (len(sides) + 2))
    peak = (largest * 4 + (c["expert_group_gib"] * GIB if has_experts else 0)
            + c["head_block_gib"] * GIB + activations) / GIB + c["fixed_gib"]
    stored = total * 2  # bf16 checkpoints; float32 ones read twice as much
    pass_s = stored * len(sides) / GIB / c["read_gib_per_s"]
    per_1k = 2 * active_params * 1000 * len(sides) / (c["cpu_gflops"] * 1e9)
    layers = len(per_layer)
    bank = 1000 * ((vocab or 0) + layers * hidden) * sum(sides) / 2**20
    mode = "resident" if available_gib is None or resident <= available_gib else "streamed"
    return ReferenceEstimate(
        resident_gib=round(resident, 3), available_gib=available_gib, mode=mode,
        streamed_peak_gib=round(peak, 1), largest_layer_params=largest,
        pass_seconds=round(pass_s, 1), seconds_per_1k_positions=round(per_1k, 1),
        bank_mib_per_1k_positions=round(bank, 1),
        basis=(f"{COEFFICIENTS.name}: {c['read_gib_per_s']} GiB/s read, {c['cpu_gflops']} GFLOP/s, "
               f"windows of {window} positions (measured by bench/bench_streamed.py on a 2-core "
               "machine; another worker scales them)"))


def available_gib() -> float | None:
    from day0.execution.memory import available_bytes

    found = available_bytes()
    return round(found / GIB, 1) if found is not None else None


__all__ = ["ReferenceEstimate", "estimate", "available_gib", "COEFFICIENTS"]
