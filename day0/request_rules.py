"""The rules for a validation request from the command line, so the CLI only parses and
dispatches: :func:`build` checks source, target, gates, stage settings and the stages' options
before Prefect starts (a bad one is exit 2 at once, not a failed run) and makes a
day0.request.ValidateRequest, :func:`stage_inputs` does the same for a single stage, and
:func:`exit_status` maps a report to the process's exit code.
"""

from __future__ import annotations

from pathlib import Path

from day0.errors import ConfigError, InputError, did_you_mean
from day0.request import ValidateRequest
from day0.store.links import refuse_escaping


def check_source(source: str) -> str:
    """source as a run gets it: an s3:// URI of valid form, or an existing local path made
    absolute (the flow may run in another working directory). Raises InputError."""
    if source.startswith("s3://"):
        from day0.store.s3 import parse_s3_uri

        parse_s3_uri(source)  # malformed URI: exit 2 here; a missing prefix: the stage says so
        return source
    if "://" in source or not Path(source).exists():
        raise InputError("no such file or folder", file=source,
                         fix="pass a checkpoint folder or a config.json")
    folder = Path(source) if Path(source).is_dir() else Path(source).parent
    refuse_escaping(folder)  # before a server starts: a link out of the checkpoint is exit 2
    return str(Path(source).resolve())


def check_texts(source: str, settings: dict[str, dict]) -> None:
    """Every evaluation text the run would read (the checkpoint's heldout.txt, each stage's
    text_file) within its size limit, before a server starts (exit 2)."""
    from day0.checkpoint.limits import check_text_size

    if not source.startswith("s3://"):
        folder = Path(source) if Path(source).is_dir() else Path(source).parent
        if (folder / "heldout.txt").is_file():
            check_text_size(folder / "heldout.txt", "heldout.txt", in_checkpoint=True)
    for name, config in settings.items():
        text = (config or {}).get("text_file")
        if isinstance(text, str) and Path(text).expanduser().is_file():
            check_text_size(Path(text).expanduser(), f"{name}.text_file")


def stage_configs(config: str | None = None) -> dict[str, dict]:
    """Per-stage settings from a YAML file ({stage: {...}}), each name a registered stage. Each
    stage's Config checks its own fields later."""
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
    return configs


def build(source: str, *, target: str | None = None, target_file: str | None = None,
          gates: str | None = None, out: str | None = None, config: str | None = None,
          use_cache: bool = True, trust_remote_code: bool = False,
          revision: str | None = None, deployment: str | None = None,
          stages: list[str] | None = None, options: dict | None = None,
          bring_up: bool = False) -> ValidateRequest:
    """A checked request from command-line values; raises InputError/ConfigError (exit 2)
    before any run starts. deployment: the request goes to that deployment's workers.
    options: the stages' options by name (day0.execution.contract.Option); None and False are unset."""
    from day0.verdict.gates import load_gates
    from day0.execution.targets import resolve_target

    source = check_source(source)
    profile = resolve_target(target, target_file)
    if deployment and target_file:
        raise ConfigError("--target-file is read on this machine only", field="--target-file",
                          fix="with --deployment, name a target the worker knows (--target NAME)")
    from day0.verdict import pipeline
    from day0 import stages as registry

    gate_file = load_gates(gates)
    # unknown stages, or not for this kind of target; gates the stages' items cannot power
    waves = registry.plan(stages, profile.kind)
    configs = stage_configs(config)
    options = registry.check_options(options)  # a file made absolute; the flow sets them
    settings = registry.apply_options(configs, options)
    pipeline.check_configs(settings, config)
    pipeline.check_gates(gate_file, settings, waves)
    check_texts(source, settings)
    return ValidateRequest(
        source=source, target=None if target_file else profile.name, target_file=target_file,
        gates=gates, out=str(Path(out).resolve()) if out else None,
        stage_configs=configs or None, use_cache=use_cache,
        trust_remote_code=trust_remote_code, revision=revision, stages=stages or None,
        options=options or None, bring_up=bring_up)


def stage_inputs(source: str, *, target: str | None = None, target_file: str | None = None,
                 trust_remote_code: bool = False):
    """day0.execution.contract.StageInputs for running one stage here (`day0 analyze`, `day0 scan`)."""
    from day0.execution.contract import StageInputs
    from day0.execution.targets import resolve_target

    check_source(source)
    return StageInputs(source=source, target=resolve_target(target, target_file),
                       trust_remote_code=trust_remote_code)


def exit_status(report) -> tuple[int, str | None]:
    """(exit code, error line) of a day0.verdict.report.Report: 2 when a stage refused its input or
    config (the same code as when the CLI itself refuses them), else the verdict's code."""
    refused = [s for s in report.stages.values() if s.failure in ("input", "config")]
    return report.exit_code, (refused[0].error if refused else None)

