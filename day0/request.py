"""The parameters of one validation: the `validate` flow's signature, in one place.

The CLI, the release receiver and `prefect deployment run` all start the same flow; they build
a :class:`ValidateRequest` and pass ``as_parameters()``. A test checks that the flow's
signature and these fields agree, so a parameter is named here once. The rules for a request
from the command line are day0.request_rules'.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ValidateRequest(BaseModel):
    """One validation of one checkpoint on one target."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="Checkpoint folder, config.json or s3://bucket/prefix.")
    target: str | None = Field("cpu-bf16", description="Target profile name (see `day0 targets`).")
    target_file: str | None = Field(None, description="A YAML file with one target profile "
                                                      "(instead of target).")
    gates: str | None = Field(None, description="Gates file (default ./gates.yaml or the shipped one).")
    out: str | None = Field(None, description="Local folder for report.json and report.md.")
    stage_configs: dict[str, dict] | None = Field(None, description=(
        "Per-stage settings by stage name, each validated by that stage's Config."))
    stages: list[str] | None = Field(None, description=(
        "Stages to run (with the stages they need); default every registered stage that "
        "supports the target."))
    use_cache: bool = Field(True, description="Reuse stage outcomes whose inputs are unchanged.")
    trust_remote_code: bool = Field(False, description="Allow the model's own code (auto_map).")
    model: str | None = Field(None, description=(
        "The model's name as the release names it (e.g. acme/tiny-llama); default from the "
        "source (day0.store.identity)."))
    revision: str | None = Field(None, description=(
        "The release's revision; default a digest of the weights (day0.store.identity)."))
    bring_up: bool = Field(False, description=(
        "The weights are placeholders (a port brought up before trained weights exist, as "
        "vLLM's --load-format dummy): findings that only mean 'untrained' (perplexity near "
        "uniform) are notes, not BROKEN; finite-weight and shape checks and the alignment "
        "gates still apply. The report and the run's state say 'bring-up: weights "
        "untrained': never a release verdict."))
    options: dict[str, str | bool] | None = Field(None, description=(
        "Options the stages add, by name (`day0 stages` lists them), e.g. {duration: 10h, "
        "promote_baseline: true}: each sets its stage's setting (day0.execution.contract.Option)."))

    def as_parameters(self) -> dict:
        """Flow-run parameters: only what differs from the defaults (short, readable runs).

        source and target always: a deployment served with another default target must not
        replace an explicit cpu-bf16."""
        return self.model_dump(mode="json", exclude_defaults=True) | {"source": self.source,
                                                                      "target": self.target}


PARAMETERS = tuple(ValidateRequest.model_fields)
