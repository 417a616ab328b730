"""The `day0` command line: analyze, scan, validate, plus targets/metrics/gates helpers.

It only parses and dispatches: the rules for a request live in day0.request, the flow is run
through day0.orchestration (the engine's one adapter to Prefect).

Exit codes (docs/errors-and-exit-codes.md; day0.errors): 0 PASS (or command succeeded), 1 FAIL
(TargetFault), 2 bad input or config (Day0Error), 3 ERROR (StageError: a stage could not
finish), 4 internal error, 5 BROKEN (the checkpoint itself is broken, whatever the target does).
A verdict the results store did not take (kept in the outbox, published later) exits 3 for a
PASS, else its verdict's code, after one line saying so and where the report is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from day0.errors import Day0Error


def _add_target_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--target", default=None, help="target profile name (default cpu-bf16); see `day0 targets`")
    group.add_argument("--target-file", default=None, help="read a single target profile from this YAML file")


def _add_stage_options(p: argparse.ArgumentParser) -> None:
    """The options the registered stages add (day0.execution.contract.Option), each named by its stage."""
    from day0 import stages

    group = p.add_argument_group("options the stages add (`day0 stages`)")
    for stage, option in stages.options():
        kind = {"action": "store_true"} if option.kind == "switch" \
            else {"default": None, "metavar": option.metavar or option.name.upper()}
        group.add_argument(option.flag, dest=f"option.{option.name}", help=f"{option.help} "
                           f"({stage})", **kind)


def _stage_option_values(args) -> dict:
    prefix = "option."
    return {k[len(prefix):]: v for k, v in vars(args).items() if k.startswith(prefix)}


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

    _add_validate_parser(sub)

    p = sub.add_parser("reference", help="compute the reference bank ahead of time (no target)",
                       description="Run the reference (cpu/float32) and the control at each "
                                   "--dtype over the alignment windows and store them in the "
                                   "reference bank (alignment.reference_bank_uri, "
                                   "$DAY0_REFERENCE_BANK_URI, or next to the results), so later "
                                   "targets run no reference forward. Settings that key the bank "
                                   "(windows, prompts) come from --config as for validate.")
    p.add_argument("source", help="checkpoint folder or s3://BUCKET/PREFIX")
    p.add_argument("--dtype", action="append", default=None, metavar="DTYPE",
                   help="a control dtype (repeatable; default bfloat16)")
    p.add_argument("--config", default=None, help="YAML with per-stage settings (its alignment: part)")
    p.add_argument("--text", default=None, help="evaluation text (default: built-in)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code (auto_map)")

    p = sub.add_parser("serve", help="serve the validate deployment on the Prefect server (PREFECT_API_URL)",
                       description="Registers deployment validate/NAME and executes its runs in this process's "
                                   "subprocesses; re-validate with `prefect deployment run 'validate/NAME' -p source=...`.")
    p.add_argument("--name", default="day0", help="deployment name (default day0)")
    p.add_argument("--target", default=None, help="default target parameter of the deployment")
    p.add_argument("--limit", type=int, default=None, help="most flow runs at once")

    p = sub.add_parser("baseline", help="performance baselines",
                       description="Promote a finished run's performance figures to baseline.")
    base = p.add_subparsers(dest="action", required=True)
    s = base.add_parser("promote", help="make a run (its --out folder or published run folder) "
                                        "the baseline of its model, revision and target")
    s.add_argument("run", metavar="RUN_FOLDER", help="folder (or s3:// prefix) with report.json")
    s.add_argument("--store", default=None, help="baseline folder or s3:// prefix (default: "
                                                 "the results location, else day0's cache)")
    p = sub.add_parser("stages", help="list the registered stages: what each proves, needs and "
                                      "runs on")
    p.add_argument("--json", action="store_true", help="one JSON document")
    sub.add_parser("targets", help="list the available target profiles")
    sub.add_parser("metrics", help="list every metric a gate may name")
    p = sub.add_parser("gates", help="check a gates file", description="Validate a gates file and list its gates.")
    p.add_argument("file", nargs="?", default=None, help="gates file (default ./gates.yaml)")
    _add_hooks_parser(sub)
    _add_stack_parser(sub)
    _add_server_parser(sub)
    return parser


def _add_validate_parser(sub) -> None:
    p = sub.add_parser("validate", help="run the validate Prefect flow and print the gated verdict",
                       description="analysis -> scan + alignment -> gates.yaml -> verdict. Exit codes: "
                                   "0 PASS, 1 FAIL (the target), 2 bad input or config, 3 ERROR (a "
                                   "stage could not finish), 4 internal error, 5 BROKEN (the "
                                   "checkpoint itself is broken); a PASS the results store "
                                   "did not take (kept in the outbox) exits 3.")
    p.add_argument("source", help="checkpoint folder")
    _add_target_args(p)
    p.add_argument("--gates", default=None, help="gates file (default ./gates.yaml or the shipped one)")
    p.add_argument("--out", default=None, help="folder for report.json and report.md")
    p.add_argument("--config", default=None, help="YAML with per-stage settings: {analysis: {...}, scan: {...}, alignment: {...}}")
    p.add_argument("--no-cache", action="store_true", help="recompute every stage")
    p.add_argument("--stages", default=None, type=lambda v: [s for s in v.split(",") if s],
                   metavar="A,B", help=(
                       "run only these stages (and what they need), e.g. smoke,api_alignment; "
                       "default every stage for the target's kind (`day0 stages`)"))
    p.add_argument("--revision", default=None, help=(
        "the release's revision: names the results path and keys the reference perplexity "
        "stored for later runs of this model and revision"))
    _add_stage_options(p)
    p.add_argument("--json", action="store_true", help="print report.json instead of the table")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code (auto_map)")
    p.add_argument("--bring-up", action="store_true",
                   help="the weights are untrained placeholders (a port before its weights): "
                        "'untrained' findings become notes; the verdict says bring-up")
    p.add_argument("--deployment", default=None, metavar="NAME",
                   help="run on a served deployment (e.g. validate/day0) via PREFECT_API_URL and wait")


def _add_hooks_parser(sub) -> None:
    p = sub.add_parser("hooks", help="release receiver: webhooks and object-store events -> Prefect runs",
                       description="Receive release webhooks and object-store events and submit "
                                   "one validation per (model, revision, target) to Prefect.")
    hooks = p.add_subparsers(dest="hooks_command", required=True, metavar="SUBCOMMAND")
    s = hooks.add_parser("serve", help="run the receiver (HTTP) until interrupted",
                         description="Serve POST /v1/events/s3, /v1/events/seaweedfs, "
                                     "/v1/webhooks/release and GET /healthz.")
    s.add_argument("--config", default=None, help="receiver YAML (see day0/data/receiver.yaml)")
    s.add_argument("--host", default=None, help="listen address (default from config: 127.0.0.1)")
    s.add_argument("--port", type=int, default=None, help="listen port (default from config: 8787)")


def _add_server_parser(sub) -> None:
    p = sub.add_parser("server", help="one Prefect server (API and UI) kept for later day0 commands",
                       description="A Prefect server that `day0 validate` attaches to when "
                                   "PREFECT_API_URL is not set, instead of starting a temporary "
                                   "one per command; state under "
                                   "${XDG_STATE_HOME:-~/.local/state}/day0/server.")
    server = p.add_subparsers(dest="server_command", required=True, metavar="SUBCOMMAND")
    s = server.add_parser("start", help="start it (or report the one running) and return")
    s.add_argument("--port", type=int, default=None, help="port (default 4200 if free, else a free one)")
    s.add_argument("--idle-minutes", type=float, default=30.0, help=(
        "stop after this long with no day0 command attached and no flow run busy (30)"))
    s.add_argument("--timeout", type=float, default=180.0, help="seconds it may take to answer (180)")
    server.add_parser("stop", help="stop it")
    server.add_parser("status", help="its address, busy runs and idle time (exit 1 unless it runs)")


def _add_stack_parser(sub) -> None:
    p = sub.add_parser("stack", help="the release-to-verdict stack on this machine, without Docker",
                       description="Prefect server + UI, release receiver, SeaweedFS (S3, bucket "
                                   "models) and `day0 serve`, as processes of this user with state "
                                   "under ${XDG_STATE_HOME:-~/.local/state}/day0/stack.")
    stack = p.add_subparsers(dest="stack_command", required=True, metavar="SUBCOMMAND")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--state-dir", default=None, help=(
        "state, secrets, data and logs (default $DAY0_STACK_DIR, else "
        "${XDG_STATE_HOME:-~/.local/state}/day0/stack)"))
    s = stack.add_parser("up", parents=[where], help="start the four processes, each once healthy",
                         description="Start Prefect, the receiver, SeaweedFS and `day0 serve` in "
                                     "order (on a partly running stack: what does not run, keeping "
                                     "the rest); print the UI URL and the upload command.")
    for name, default in (("prefect", 4200), ("receiver", 8787), ("s3", 8333)):
        s.add_argument(f"--{name}-port", type=int, default=None, help=(
            f"port (default $DAY0_STACK_{name.upper()}_PORT, else the last up's, else {default} "
            "if free, else a free one)"))
    s.add_argument("--target", default=None, help="target the deployment validates (cpu-bf16)")
    s.add_argument("--timeout", type=float, default=None, help="seconds each process may take to be healthy")
    s = stack.add_parser("restart", parents=[where], help="stop one process's whole tree and start it again",
                         description="Restart one part on the same ports and wait until it is "
                                     "healthy; stack.json follows it.")
    s.add_argument("part", metavar="PART", choices=("prefect", "receiver", "seaweedfs", "store", "serve"),
                   help="prefect, receiver, seaweedfs (or store) or serve")
    s.add_argument("--timeout", type=float, default=None, help="seconds it may take to be healthy")
    stack.add_parser("down", parents=[where], help="stop everything `up` started, orphans included")
    stack.add_parser("status", parents=[where], help="pid, ports and liveness of each process (exit 1 unless all run)")
    s = stack.add_parser("upload", parents=[where], help="upload a checkpoint folder to s3://models/NAME",
                         description="Upload DIR's files to s3://models/NAME/ (shards last): the "
                                     "receiver starts one validation once it is complete.")
    s.add_argument("folder", metavar="DIR", help="checkpoint folder")
    s.add_argument("name", metavar="NAME", help="model name = key prefix, e.g. acme/tiny-llama")
    s.add_argument("--wait", action="store_true", help="follow the run it starts; exit 0 when it completed")
    s.add_argument("--timeout", type=float, default=900, help="seconds --wait waits (900)")


def _inputs(args):
    from day0 import request_rules

    return request_rules.stage_inputs(args.source, target=args.target, target_file=args.target_file,
                                trust_remote_code=args.trust_remote_code)


def cmd_analyze(args) -> int:
    from day0.stages.analysis import core, report

    result = core.run(core.Config(), _inputs(args))
    print(json.dumps(result.model_dump(mode="json"), indent=2) if args.json else report.summary_text(result))
    return 5 if result.checkpoint_problems else 0  # BROKEN, as `day0 validate` would end


def cmd_scan(args) -> int:
    from day0.stages.scan import core

    result = core.run(core.Config(probe=not args.no_probe), _inputs(args))
    print(json.dumps(result.model_dump(mode="json"), indent=2) if args.json else core.summary_text(result))
    return 0


def cmd_validate(args) -> int:
    from day0.verdict import report as reporting
    from day0.rendering import report as rendering
    from day0 import request_rules
    from day0.orchestration import local

    # bad source, target, gates or stage settings: exit 2 before Prefect starts
    req = request_rules.build(
        args.source, target=args.target, target_file=args.target_file, gates=args.gates,
        out=args.out, config=args.config, use_cache=not args.no_cache,
        trust_remote_code=args.trust_remote_code, revision=args.revision,
        deployment=args.deployment, stages=args.stages, options=_stage_option_values(args),
        bring_up=args.bring_up)
    if not args.deployment:
        local.warm_up(req)
    report_json = local.validate_on(args.deployment, req) if args.deployment else local.validate(req)
    report = reporting.Report.model_validate(report_json)
    code, error = request_rules.exit_status(report)
    if error is not None:
        print(f"day0: error: {error}", file=sys.stderr)
        return code
    print(report.model_dump_json(indent=2) if args.json else rendering.verdict_table(report))
    # first divergent layer, report path, results URI (stderr with --json: stdout stays JSON)
    for line in rendering.closing_lines(report, req.out):
        print(line, file=sys.stderr if args.json else sys.stdout)
    if report.unpublished:  # a verdict the results store does not hold (exit_code: never 0)
        print(f"day0: error: the report was not published: {report.unpublished}", file=sys.stderr)
    return code


def cmd_reference(args) -> int:
    from day0.stages.alignment.prebuild import build

    for line in build(args.source, args.dtype or ["bfloat16"], config=args.config,
                      text=args.text, trust_remote_code=args.trust_remote_code):
        print(line)
    return 0


def cmd_baseline(args) -> int:
    from day0.stages.performance.promote import promote_run

    uri, runs = promote_run(args.run, store=args.store)
    print(f"baseline: {uri} ({len(runs)} runs: {', '.join(runs)})")
    return 0


def cmd_serve(args) -> int:
    """Register the `validate` deployment on PREFECT_API_URL and run its flow runs here; publish
    what a results-store outage left in the outbox every few seconds meanwhile."""
    from day0.orchestration import local, outbox

    outbox.start_draining()
    local.serve(args.name, limit=args.limit, target=args.target)
    return 0


def cmd_targets(args) -> int:
    from day0.execution.targets import available_targets

    targets = available_targets().values()
    width = max(len(t.name) for t in targets)
    for t in targets:
        runner = {"docker": f"docker:{t.container.image}" if t.container else "docker",
                  "deployment": f"deployment:{t.deployment}"}.get(t.runner, t.runner)
        print(f"{t.name:<{width}}  {t.device:<6} {t.dtype:<9} {runner:<20} plugins={len(t.plugins)}"
              f"  {t.description}")
    return 0


def cmd_stages(args) -> int:
    from day0 import stages

    rows = [stages.get(name).describe() for name in stages.names()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [("STAGE", "RUNS ON", "NEEDS", "FLAGS", "OPTIONS", "PROVES")]
    for r in rows:
        flags = [flag for flag, on in (("engine", r["uses_endpoint"]), ("alone", r["exclusive"]))
                 if on]
        table.append((r["name"], "/".join(r["runs_on"]),
                      ", ".join(r["requires"] + [f"after {a}" for a in r["after"]]) or "-",
                      ",".join(flags) or "-", " ".join(r["options"]) or "-", r["proves"]))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[5])
    print("\nFLAGS: engine = talks to an engine target's server; alone = runs after every other "
          "stage with nothing else on the machine (it measures time). OPTIONS: what it adds to "
          "`day0 validate`. Stages come from day0, the 'day0.stages' entry points and "
          "day0.stages.register.")
    return 0


def cmd_metrics(args) -> int:
    from day0.verdict.gates import metric_catalog

    for name, info in sorted(metric_catalog().items()):
        print(f"{name:<44} {info.get('unit', ''):<10} {info.get('description', '')}")
    return 0


def cmd_gates(args) -> int:
    from day0.verdict.gates import default_gates_path, load_gates

    parsed = load_gates(args.file)
    print(f"{args.file or default_gates_path()}: {len(parsed.gates)} gates OK")
    for g in parsed.gates:
        rule = (f"paired {g.paired.test}: detects a drop of {g.paired.allowed_drop:g}, alpha "
                f"{g.paired.alpha:g}, power {g.paired.power:g}") if g.paired \
            else f"{g.op} {g.threshold:g}"
        print(f"  {g.id:<28} {g.metric} {rule} [{g.severity}, {g.applies_to}]")
    return 0


def cmd_hooks(args) -> int:
    from day0.receiver.settings import load_settings

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = load_settings(args.config, **overrides)
    from day0.receiver.app import serve

    serve(settings)
    return 0


def cmd_server(args) -> int:
    from day0.orchestration import server

    if args.server_command == "start":
        if args.idle_minutes <= 0 or args.timeout <= 0:
            print("day0: error: --idle-minutes and --timeout must be positive", file=sys.stderr)
            return 2
        server.start(port=args.port, idle_minutes=args.idle_minutes, timeout_s=args.timeout)
        return 0
    if args.server_command == "stop":
        server.stop()
        return 0
    return 0 if server.status() else 1


def cmd_stack(args) -> int:
    from day0 import stack

    if args.stack_command == "up":
        ports = {"prefect": args.prefect_port, "receiver": args.receiver_port, "s3": args.s3_port}
        stack.up(args.state_dir, ports=ports, target=args.target, timeout_s=args.timeout)
        return 0
    if args.stack_command == "restart":
        stack.restart(args.part, args.state_dir, timeout_s=args.timeout)
        return 0
    if args.stack_command == "down":
        stack.down(args.state_dir)
        return 0
    if args.stack_command == "status":
        return 0 if stack.status(args.state_dir) else 1
    return stack.upload(args.folder, args.name, args.state_dir, wait=args.wait,
                        timeout_s=args.timeout)


COMMANDS = {"analyze": cmd_analyze, "scan": cmd_scan, "validate": cmd_validate, "serve": cmd_serve,
            "stages": cmd_stages, "targets": cmd_targets, "metrics": cmd_metrics, "gates": cmd_gates,
            "hooks": cmd_hooks, "stack": cmd_stack, "server": cmd_server, "baseline": cmd_baseline,
            "reference": cmd_reference}


def _keep_report_on_bug(args, exc: Exception, started: float) -> None:
    """A day0 bug stopped `validate` before the flow could keep what finished: out still gets a
    report.json (verdict ERROR, the bug named), never none or an earlier run's."""
    out = getattr(args, "out", None) if args.command == "validate" else None
    path = Path(out) / "report.json" if out else None
    if path is None or (path.exists() and path.stat().st_mtime >= started):
        return  # the flow wrote this run's
    try:
        from day0.atomic import write_atomic
        from day0.execution.targets import REFERENCE, resolve_target
        from day0.verdict import report as reporting

        report = reporting.unconcluded(
            source=str(args.source), target=resolve_target(args.target, args.target_file),
            reference=REFERENCE, outcomes={}, error=exc)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, report.model_dump_json(indent=2))
    except Exception:  # noqa: BLE001 - the bug is what the user is told; this is a courtesy
        pass


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = _parser().parse_args(argv)
    # the temporary local server would try to phone home; day0 runs where only registries answer
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect waits 20 s for its temporary server; on a busy 2-core worker startup (migrations)
    # takes longer, and a validate that never started is no verdict
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
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
        from day0.errors import shorten

        _keep_report_on_bug(args, exc, started)
        print(f"day0: internal error: {shorten(f'{type(exc).__name__}: {exc}', 300)} "
              "(rerun with DAY0_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return 4


if __name__ == "__main__":
    sys.exit(main())
