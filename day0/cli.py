"""The `day0` command line: analyze, scan, validate, plus targets/metrics/gates helpers.

Exit codes: 0 PASS (or command succeeded), 1 FAIL, 2 bad input or config (one line naming file,
field and fix), 3 ERROR (a stage could not finish: crash, timeout, out of memory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from day0.errors import Day0Error, InputError


def _add_target_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--target", default=None, help="target profile name (default cpu-bf16); see `day0 targets`")
    group.add_argument("--target-file", default=None, help="read a single target profile from this YAML file")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="day0", description=(
        "Day-0 validation of an LLM checkpoint on an accelerator target."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("analyze", help="architecture, params, memory, KV cache, parallel plan, risks",
                       description="Analyse a checkpoint from config.json and safetensors headers only.")
    p.add_argument("source", help="checkpoint folder or config.json")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code (auto_map)")
    _add_target_args(p)

    p = sub.add_parser("scan", help="record every aten op of a full-size meta forward; coverage on the target",
                       description="Operator scan on meta tensors at full size, then coverage on the target.")
    p.add_argument("source", help="checkpoint folder or config.json")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--no-probe", action="store_true", help="skip probing ops on the target device")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code (auto_map)")
    _add_target_args(p)

    p = sub.add_parser("validate", help="run the validate Prefect flow and print the gated verdict",
                       description="analysis -> scan + alignment -> gates.yaml -> PASS/FAIL (exit 0/1).")
    p.add_argument("source", help="checkpoint folder")
    _add_target_args(p)
    p.add_argument("--gates", default=None, help="gates file (default ./gates.yaml or the shipped one)")
    p.add_argument("--out", default=None, help="folder for report.json and report.md")
    p.add_argument("--text", default=None, help="evaluation text for alignment (default: built-in)")
    p.add_argument("--config", default=None, help="YAML with per-stage settings: {analysis: {...}, scan: {...}, alignment: {...}}")
    p.add_argument("--no-cache", action="store_true", help="recompute every stage")
    p.add_argument("--json", action="store_true", help="print report.json instead of the table")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code (auto_map)")

    sub.add_parser("targets", help="list the available target profiles")
    sub.add_parser("metrics", help="list every metric a gate may name")
    p = sub.add_parser("gates", help="check a gates file", description="Validate a gates file and list its gates.")
    p.add_argument("file", nargs="?", default=None, help="gates file (default ./gates.yaml)")
    return parser


def _inputs(args, source: str):
    from day0.contract import StageInputs
    from day0.targets import resolve_target

    if not Path(source).exists():
        raise InputError("no such file or folder", file=source,
                         fix="pass a checkpoint folder or a config.json")
    return StageInputs(source=source, target=resolve_target(args.target, args.target_file),
                       trust_remote_code=getattr(args, "trust_remote_code", False))


def cmd_analyze(args) -> int:
    from day0 import analysis

    result = analysis.run(analysis.Config(), _inputs(args, args.source))
    print(json.dumps(result.model_dump(mode="json"), indent=2) if args.json else analysis.summary_text(result))
    return 0


def cmd_scan(args) -> int:
    from day0 import scan

    result = scan.run(scan.Config(probe=not args.no_probe), _inputs(args, args.source))
    print(json.dumps(result.model_dump(mode="json"), indent=2) if args.json else scan.summary_text(result))
    return 0


def _stage_configs(args) -> dict:
    from day0.yamlio import read_mapping

    configs = {}
    if args.config:
        configs = read_mapping(args.config) or {}
        if not isinstance(configs, dict):
            raise InputError("must map stage names to settings", file=args.config,
                             fix="write e.g. 'alignment: {max_windows: 4}'")
    if args.text:
        if not Path(args.text).is_file():
            raise InputError("evaluation text not found", file=args.text, fix="check the --text path")
        configs.setdefault("alignment", {})["text_file"] = str(Path(args.text).resolve())
    return configs


def cmd_validate(args) -> int:
    from day0 import gates, report as reporting
    from day0.stage import STAGES
    from day0.errors import ConfigError, did_you_mean

    inputs = _inputs(args, args.source)  # bad source or target: exit 2 before Prefect starts
    gates.load_gates(args.gates)
    configs = _stage_configs(args)
    for name in configs:
        if name not in STAGES:
            raise ConfigError(f"unknown stage '{name}'", file=args.config, field=name,
                              fix=did_you_mean(name, STAGES).strip() or f"use {sorted(STAGES)}")
    from flows.validate import validate

    report_json = validate(source=str(Path(args.source).resolve()),
                           target=None if args.target_file else inputs.target.name,
                           target_file=args.target_file, gates=args.gates,
                           out=str(Path(args.out).resolve()) if args.out else None,
                           stage_configs=configs, use_cache=not args.no_cache,
                           trust_remote_code=args.trust_remote_code)
    report = reporting.Report.model_validate(report_json)
    bad_input = [s for s in report.stages.values() if s.failure in ("input", "config")]
    if bad_input:
        print(f"day0: error: {bad_input[0].error}", file=sys.stderr)
        return 2
    print(report.model_dump_json(indent=2) if args.json else reporting.verdict_table(report))
    return report.exit_code


def cmd_targets(args) -> int:
    from day0.targets import available_targets

    for t in available_targets().values():
        print(f"{t.name:<12} {t.device:<6} {t.dtype:<9} plugins={len(t.plugins)}  {t.description}")
    return 0


def cmd_metrics(args) -> int:
    from day0.gates import metric_catalog

    for name, info in sorted(metric_catalog().items()):
        print(f"{name:<44} {info.get('unit', ''):<10} {info.get('description', '')}")
    return 0


def cmd_gates(args) -> int:
    from day0.gates import default_gates_path, load_gates

    parsed = load_gates(args.file)
    print(f"{args.file or default_gates_path()}: {len(parsed.gates)} gates OK")
    for g in parsed.gates:
        print(f"  {g.id:<28} {g.metric} {g.op} {g.threshold:g} [{g.severity}, {g.applies_to}]")
    return 0


COMMANDS = {"analyze": cmd_analyze, "scan": cmd_scan, "validate": cmd_validate,
            "targets": cmd_targets, "metrics": cmd_metrics, "gates": cmd_gates}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except Day0Error as exc:
        print(f"day0: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("day0: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a day0 bug: one line unless asked for the traceback
        if os.environ.get("DAY0_DEBUG"):
            raise
        print(f"day0: internal error: {type(exc).__name__}: {exc} "
              "(rerun with DAY0_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(main())
