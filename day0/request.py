"""The parameters of one validation: the `validate` flow's signature, in one place.

The CLI, the release receiver and `prefect deployment run` all start the same flow; they build
a :class:`ValidateRequest` and pass ``as_parameters()``. A test checks that the flow's
signature and these fields agree, so a parameter is named here once.

The rules for a request from the command line live here too, so the CLI only parses and
dispatches: :func:`build` checks source, target, gates and stage settings before Prefect starts
(a bad one is exit 2 at once, not a failed run), :func:`stage_inputs` does the same for a single
stage, and :func:`exit_status` maps a report to the process's exit code.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from day0.errors import ConfigError, InputError, did_you_mean

# --text FILE: the evaluation text of the stage that reads one (its Config field)
TEXT_SETTING = ("alignment", "text_file")


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
        "source (day0.identity)."))
    revision: str | None = Field(None, description=(
        "The release's revision; default a digest of the weights (day0.identity)."))
    promote_baseline: bool = Field(False, description=(
        "Store this run's performance figures as the baseline of its model, revision and "
        "target (only ever on request; automatic runs never do)."))

    def as_parameters(self) -> dict:
        """Flow-run parameters: only what differs from the defaults (short, readable runs).

        source and target always: a deployment served with another default target must not
        replace an explicit cpu-bf16."""
        return self.model_dump(mode="json", exclude_defaults=True) | {"source": self.source,
                                                                      "target": self.target}


def check_source(source: str) -> str:
    """source as a run gets it: an s3:// URI of valid form, or an existing local path made
    absolute (the flow may run in another working directory). Raises InputError."""
    if source.startswith("s3://"):
        from day0.storage import parse_s3_uri

        parse_s3_uri(source)  # malformed URI: exit 2 here; a missing prefix: the stage says so
        return source
    if "://" in source or not Path(source).exists():
        raise InputError("no such file or folder", file=source,
                         fix="pass a checkpoint folder or a config.json")
    return str(Path(source).resolve())


def stage_configs(config: str | None = None, text: str | None = None) -> dict[str, dict]:
    """Per-stage settings from a YAML file ({stage: {...}}), each name a registered stage, plus
    the evaluation text (TEXT_SETTING). Each stage's Config checks its own fields later."""
    from day0 import stages
    from day0.yamlio import read_mapping

    configs = (read_mapping(config) or {}) if config else {}
    if not isinstance(configs, dict):
        raise InputError("must map stage names to settings", file=config,
                         fix="write e.g. 'alignment: {max_windows: 4}'")
    known = stages.names()
    for name, settings in configs.items():
        if name not in known:
            raise ConfigError(f"unknown stage '{name}'", file=config, field=str(name),
                              fix=did_you_mean(name, known).strip() or f"use {sorted(known)}")
        if not isinstance(settings, dict):
            raise ConfigError("must map setting names to values", file=config, field=str(name),
                              fix=f"write e.g. '{name}: {{}}'")
    if text:
        if not Path(text).is_file():
            raise InputError("evaluation text not found", file=text, fix="check the --text path")
        stage, setting = TEXT_SETTING
        configs.setdefault(stage, {})[setting] = str(Path(text).resolve())
    return configs


def with_promotion(configs: dict[str, dict], promote: bool) -> dict[str, dict]:
    """Stage settings asking the performance stage to store this run as the baseline (the only
    way a baseline is made: `--promote-baseline`, the deployment's promote_baseline)."""
    if not promote:
        return configs
    return {**configs, "performance": {**configs.get("performance", {}), "promote_baseline": True}}


def build(source: str, *, target: str | None = None, target_file: str | None = None,
          gates: str | None = None, out: str | None = None, config: str | None = None,
          text: str | None = None, use_cache: bool = True, trust_remote_code: bool = False,
          revision: str | None = None, deployment: str | None = None,
          stages: list[str] | None = None, promote_baseline: bool = False,
          duration: str | None = None) -> ValidateRequest:
    """A checked request from command-line values; raises InputError/ConfigError (exit 2)
    before any run starts. deployment: the request goes to that deployment's workers."""
    from day0.gates import load_gates
    from day0.targets import resolve_target

    source = check_source(source)
    profile = resolve_target(target, target_file)
    if deployment and target_file:
        raise ConfigError("--target-file is read on this machine only", field="--target-file",
                          fix="with --deployment, name a target the worker knows (--target NAME)")
    from day0 import pipeline
    from day0 import stages as registry

    gate_file = load_gates(gates)
    # unknown stages, or not for this kind of target; gates the stages' items cannot power
    waves = registry.plan(stages, profile.kind)
    configs = stage_configs(config, text)
    if duration is not None:  # --duration: the soak's
        from day0.durations import seconds

        try:
            if seconds(duration) <= 0:
                raise ValueError("it must be positive")
        except ValueError as exc:
            raise ConfigError(f"bad duration {duration!r}: {exc}", field="--duration",
                              fix="write e.g. 10h, 30m, 1h30m or 90s") from None
        configs = {**configs, "soak": {**configs.get("soak", {}), "duration": duration}}
    pipeline.check_gates(gate_file, configs, waves)
    return ValidateRequest(
        source=source, target=None if target_file else profile.name, target_file=target_file,
        gates=gates, out=str(Path(out).resolve()) if out else None,
        stage_configs=configs or None, use_cache=use_cache,
        trust_remote_code=trust_remote_code, revision=revision, stages=stages or None,
        promote_baseline=promote_baseline)


def stage_inputs(source: str, *, target: str | None = None, target_file: str | None = None,
                 trust_remote_code: bool = False):
    """day0.contract.StageInputs for running one stage here (`day0 analyze`, `day0 scan`)."""
    from day0.contract import StageInputs
    from day0.targets import resolve_target

    check_source(source)
    return StageInputs(source=source, target=resolve_target(target, target_file),
                       trust_remote_code=trust_remote_code)


def exit_status(report) -> tuple[int, str | None]:
    """(exit code, error line) of a day0.report.Report: 2 when a stage refused its input or
    config (the same code as when the CLI itself refuses them), else the verdict's code."""
    refused = [s for s in report.stages.values() if s.failure in ("input", "config")]
    if refused:
        return 2, refused[0].error
    return report.exit_code, None


PARAMETERS = tuple(ValidateRequest.model_fields)
