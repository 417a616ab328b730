"""The alignment tolerances file (day0/data/tolerances.yaml): schema, loading, op kinds."""

from __future__ import annotations

import fnmatch
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from day0 import DATA_DIR
from day0.yamlio import load_model, read_mapping

DEFAULT_FILE = DATA_DIR / "tolerances.yaml"
DTYPES = ("bfloat16", "float16", "float32")
OpKind = Literal["elementwise", "accumulate", "discrete", "uninitialized", "random"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpTolerance(_Strict):
    rtol: float = Field(ge=0, description="Relative tolerance, times |reference|.")
    atol: float = Field(ge=0, description="Absolute tolerance.")
    scale_atol: float = Field(0.0, ge=0, description="Absolute tolerance, times max|reference|.")


class DtypeOpTolerances(_Strict):
    elementwise: OpTolerance = Field(description="Element-wise and view ops.")
    accumulate: OpTolerance = Field(description="Reductions, matmuls, attention, norms.")


class OpKinds(_Strict):
    accumulate: list[str] = Field(default_factory=list, description="fnmatch patterns.")
    discrete: list[str] = Field(default_factory=list, description="Compared exactly.")
    uninitialized: list[str] = Field(default_factory=list, description="Skipped: no value.")
    random: list[str] = Field(default_factory=list, description="Skipped: random output.")


class OpsSection(_Strict):
    kinds: OpKinds = Field(description="Which aten ops belong to which kind.")
    tolerances: dict[Literal["bfloat16", "float16", "float32"], DtypeOpTolerances] = Field(
        description="Per target dtype.")


Claim = Literal["faithful", "int8", "fp8", "int4"]


class ControlFloors(_Strict):
    kl: float = Field(gt=0, description="Mean KL (nats) below which the control counts as this.")
    top1_disagreement: float = Field(gt=0, description="Top-1 disagreement fraction floor.")
    expert_disagreement: float = Field(gt=0, description="Expert-set disagreement (1 - Jaccard) "
                                                         "floor.")
    layer_rel_error: dict[Literal["bfloat16", "float16", "float32"], float] = Field(
        description="Layer relative error floor by target dtype (rounding level of the dtype).")


class ControlSection(_Strict):
    block_size: int = Field(ge=1, description="Consecutive positions per bootstrap block.")
    floors: ControlFloors = Field(description="Control values below these are noise.")
    layer_ratio: dict[Claim, float] = Field(description=(
        "A layer diverges when the 95 % lower bound of its target/control relative-error ratio, "
        "in its worst position bucket, exceeds this; by the target's claim."))


class Tolerances(_Strict):
    ops: OpsSection = Field(description="Per-operator replay tolerances.")
    control: ControlSection = Field(description="Target vs control comparison settings.")

    def op_kind(self, name: str) -> OpKind:
        """Kind of an aten op given its overload-packet name (e.g. 'mm', '_softmax')."""
        kinds = self.ops.kinds
        for kind in ("uninitialized", "random", "discrete", "accumulate"):
            if any(fnmatch.fnmatchcase(name, pat) for pat in getattr(kinds, kind)):
                return kind  # type: ignore[return-value]
        return "elementwise"

    def for_op(self, dtype: str, kind: str) -> OpTolerance:
        table = self.ops.tolerances[dtype]
        return table.accumulate if kind == "accumulate" else table.elementwise


@lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> Tolerances:
    return load_model(Tolerances, read_mapping(path), path)


def load_tolerances(path: str | Path | None = None) -> Tolerances:
    """Validated tolerances; a bad file is one ConfigError naming every problem."""
    path = Path(path) if path else DEFAULT_FILE
    mtime = path.stat().st_mtime if path.is_file() else 0.0
    return _load(str(path), mtime)
