"""Base of the alignment tables' row models."""

from pydantic import BaseModel, ConfigDict


class Row(BaseModel):
    """A table row; NaN/inf are findings, so JSON keeps them ("NaN", "Infinity", as day0.stage does) instead of null."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")
