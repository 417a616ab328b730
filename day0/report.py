"""The validation report: report.json (machine) and report.md (people), from stage outcomes.

report.md (and the Prefect report artifact) opens with the verdict and the first failing gate
(:func:`headline`); its gates table lists failing rows first with their severity, and a stage
that did not run is one "not evaluated" row, not a FAIL per gate (:func:`gate_rows`). The
stages' ``plots`` hooks give PNGs kept as ``plots/<stage>-<name>.png`` next to report.json."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from day0 import __version__
from day0.atomic import write_atomic
from day0.budget import StageBudget
from day0.gates import GateResult
from day0 import stages
from day0.errors import Day0Error
from day0.stage import StageOutcome
from day0.engines.settings import Endpoint
from day0.targets import Target

# 2 (bad input or config: day0.request.exit_status) and 4 (a day0 bug) are the CLI's own
EXIT_CODES = {"PASS": 0, "FAIL": 1, "ERROR": 3, "BROKEN": 5}


class StageSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool
    cached: bool
    seconds: float
    failure: str | None = None
    error: str | None = None
    ran_in: str = Field("", description="process, docker:IMAGE:CONTAINER or deployment:NAME:RUN_ID.")
    budget: StageBudget | None = Field(None, description=(
        "Memory and time the stage was allowed, and where each came from (day0.budget)."))
    peak_rss_gib: float | None = Field(None, description=(
        "The stage process's own peak resident memory, GiB (None where unknown)."))


class Report(BaseModel):
    """report.json: the verdict and all evidence behind it."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    verdict: str = Field(description=(
        "PASS, FAIL (the target), BROKEN (the checkpoint itself) or ERROR (a stage could not finish)."))
    source: str
    identity: dict = Field(default_factory=dict, description=(
        "model, revision, weights_digest and run_id (day0.identity): where this run is kept."))
    model: dict = Field(default_factory=dict, description=(
        "What the model is, from the stages' facts: architecture, model_type, attention, moe, "
        "params, dimensions."))
    target: Target
    reference: Target
    engine: Endpoint | None = Field(None, description=(
        "Engine targets: the engine the stages talked to (attached or launched; ready_s: how "
        "long the launched plain configuration took to answer)."))
    gates: list[GateResult]
    stages: dict[str, StageSummary]
    metrics: dict[str, float | None]
    evidence: dict[str, dict] = Field(default_factory=dict, description=(
        "Each stage's evidence by stage name, as the stage chooses to show it (its `evidence` "
        "hook; stages/<stage>.json in the results keeps the whole outcome)."))
    errors: list[str] = Field(default_factory=list, description="Failed stages, one line each.")
    checkpoint_problems: list[str] = Field(default_factory=list, description=(
        "Findings that the checkpoint itself is broken (not the target), from every stage."))
    findings: list[str] = Field(default_factory=list, description=(
        "One-line findings of the stages (their `findings` hook), e.g. the first divergent "
        "layer; in the headline and printed by the CLI."))
    created_at: str
    day0_version: str = __version__
    results_uri: str | None = Field(None, description=(
        "Where report.json, report.md and stages/<stage>.json were published (day0.identity)."))

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def build(*, source: str, target: Target, reference: Target, outcomes: dict[str, StageOutcome],
          gate_results: list[GateResult], verdict: str, facts: dict | None = None,
          checkpoint_problems: list[str] | None = None, identity: dict | None = None,
          engine: Endpoint | None = None) -> Report:
    metrics: dict[str, float | None] = {}
    for outcome in outcomes.values():
        metrics.update(outcome.metrics)
    evidence, findings = {}, []
    for name, outcome in outcomes.items():
        if outcome.ok and outcome.result is not None:
            stage = _stage(name)
            evidence[name] = stage.evidence(outcome.result) if stage else dict(outcome.result)
            findings += list(stage.findings(evidence[name]) if stage else [])
    return Report(
        verdict=verdict, source=source, target=target, reference=reference, engine=engine,
        gates=gate_results,
        identity=dict(identity or {}), model=dict(facts or {}),
        stages={name: StageSummary(ok=o.ok, cached=o.cached, seconds=round(o.seconds, 3),
                                   failure=o.failure, error=o.error, ran_in=o.ran_in,
                                   budget=o.budget, peak_rss_gib=o.peak_rss_gib)
                for name, o in outcomes.items()},
        metrics=metrics, evidence=evidence,
        errors=[f"stage {name}: {o.error}" for name, o in outcomes.items() if not o.ok],
        checkpoint_problems=list(checkpoint_problems or []), findings=findings,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )


def _stage(name: str):
    """The registered stage of that name; None for one no longer registered (its evidence is
    kept as it is, its hooks give nothing)."""
    try:
        return stages.get(name)
    except Day0Error:
        return None


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value}" if not math.isfinite(value) else f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) if not isinstance(v, float) else f"{v:.3g}" for v in value) + "]"
    return str(value)


# thresholds as the Prefect UI renders them: it reads each table cell as markdown, where a cell
# starting with ">" is a blockquote
UI_OPS = {"<=": "≤", ">=": "≥", "==": "=", "<": "<", ">": "above"}
ORDER = {"FAIL": 0, "WARN": 1, "not evaluated": 2, "PASS": 3, "n/a": 4}


def _result(g: GateResult) -> str:
    if not g.applicable:
        return "n/a"
    if g.passed:
        return "PASS"
    if g.not_evaluated:
        return "not evaluated"
    return "FAIL" if g.severity == "error" else "WARN"


def gate_rows(report: Report, markup: bool = False) -> list[dict]:
    """The gates, failing first (FAIL, WARN, not evaluated, PASS, n/a; gates.yaml order within),
    with severity; the gates a stage that did not run left unevaluated are one row per stage
    and reason; the gates of stages that do not run on this kind of target are one counted row,
    last (report.json keeps every gate). markup: for markdown and the Prefect UI (bold
    failures, ≥/≤ thresholds)."""
    rows: list[tuple[int, dict]] = []
    grouped: dict[str, dict] = {}
    elsewhere = _off_kind(report)
    for g in report.gates:
        if g.id in elsewhere:
            continue
        result = _result(g)
        op = UI_OPS.get(g.op, g.op) if markup else g.op
        row = {"result": result, "severity": g.severity, "gate": g.id,
               "observed": _fmt(g.observed), "threshold": f"{op} {g.threshold:g}",
               "reason": g.reason, "metric": g.metric}
        if result == "not evaluated":
            if (first := grouped.get(g.not_evaluated)) is not None:
                first["gate"] += f", {g.id}"
                first["metric"], first["threshold"] = g.metric.split(".")[0] + ".*", "—"
                if g.severity == "error":
                    first["severity"] = "error"
                continue
            grouped[g.not_evaluated] = row
        rows.append((ORDER[result], row))
    out = [row for _, row in sorted(rows, key=lambda r: r[0])]
    if elsewhere:  # the gates of stages that never run on this kind of target: one line
        names = list(dict.fromkeys(elsewhere.values()))
        out.append({"result": "n/a", "severity": "", "gate": f"{len(elsewhere)} gates",
                    "observed": "", "threshold": "—",
                    "reason": f"not applicable: their stages ({', '.join(names)}) do not run on "
                              f"{report.target.kind} targets",
                    "metric": ", ".join(f"{name}.*" for name in names)})
    if markup:
        for row in out:
            if row["result"] in ("FAIL", "WARN", "not evaluated"):
                row["result"] = f"**{row['result']}**"
    return out


def _off_kind(report: Report) -> dict[str, str]:
    """Gate id -> stage, for the gates (not applicable) on metrics of a registered stage that
    does not run on the report's kind of target (an engine stage's on a torch target)."""
    elsewhere = set(stages.not_on(report.target.kind))
    return {g.id: g.metric.split(".")[0] for g in report.gates
            if not g.applicable and g.metric.split(".")[0] in elsewhere}


def headline(report: Report) -> str:
    """One line: the verdict and why - the first failing gate (gates.yaml order), the stage that
    could not finish, or the checkpoint problem - then the stages' findings."""
    verdict = report.verdict
    failing = [g for g in report.gates if g.applicable and not g.passed]
    if verdict == "BROKEN":
        why = "the checkpoint itself is broken" + (
            f": {report.checkpoint_problems[0]}" if report.checkpoint_problems else "")
    elif verdict == "ERROR":
        broken = [(n, s) for n, s in report.stages.items() if not s.ok and s.failure != "target"]
        why = (f"stage {broken[0][0]} could not finish: {broken[0][1].error}" if broken
               else "a stage could not finish")
    elif verdict == "FAIL":
        first = next((g for g in failing if g.severity == "error"), None)
        why = "first failing gate " + (
            "?" if first is None else f"{first.id} {first.reason}" if first.not_evaluated
            else f"{first.id} ({first.metric}: {first.reason})")
    else:
        applicable = sum(g.applicable for g in report.gates)
        why = (f"{applicable - len(failing)} of {applicable} gates hold; warnings: "
               + ", ".join(g.id for g in failing)) if failing else f"all {applicable} gates hold"
    return "; ".join([f"{verdict}: {why}", *report.findings])


def stage_tables(report: Report) -> dict[str, tuple[str, list[dict]]]:
    """Extra tables the stages show (their `tables` hook): artifact key -> (description, rows)."""
    out: dict[str, tuple[str, list[dict]]] = {}
    for name, result in report.evidence.items():
        if stage := _stage(name):
            out.update(stage.tables(result))
    return out


def _table(rows: list[dict]) -> str:
    if not rows:
        return "_none_\n"
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]).replace("|", "\\|") for h in head) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_markdown(report: Report, images: dict[str, str] | None = None) -> str:
    """report.md; images: plot name -> where its PNG is (a relative path, or a data: URI for
    the Prefect UI), shown under "Plots"."""
    model = report.model or {}
    params = model.get("params") or {}
    ident = report.identity or {}
    first, _, rest = headline(report).partition(": ")
    parts = [f"# day0 validation: {report.verdict}\n", f"**{first}**: {rest}\n"]
    if report.checkpoint_problems:  # first: nothing below is about the target then
        parts += (["## The checkpoint is broken\n"] + [f"- {p}" for p in report.checkpoint_problems]
                  + ["", "Target and reference load the same broken weights: the comparisons "
                         "below say nothing about the port.\n"])
    parts += [
        f"- model: `{ident.get('model') or report.source}` revision `{ident.get('revision') or '?'}` "
        f"({model.get('architecture') or '?'}, {_fmt(params.get('total'))} params, "
        f"{_fmt(params.get('active'))} active)",
        f"- source: `{report.source}`",
        f"- target: **{report.target.label}** vs reference {report.reference.device}/{report.reference.dtype}",
        f"- created: {report.created_at}, day0 {report.day0_version}\n",
    ]
    if report.results_uri:
        parts.insert(-1, f"- results: `{report.results_uri}`")
    if report.errors:
        parts += ["## Errors\n"] + [f"- {e}" for e in report.errors] + [""]
    parts += ["## Gates\n", _table(gate_rows(report, markup=True))]
    if images:
        parts += ["## Plots\n"] + [f"![{name}]({src})\n" for name, src in images.items()]
    parts += ["## Stages\n", _table([{"stage": n, "ok": s.ok, "cached": s.cached,
                                       "seconds": s.seconds, "ran in": s.ran_in,
                                       "budget": _budget(s.budget), "error": s.error or ""}
                                      for n, s in report.stages.items()])]
    for name, result in report.evidence.items():
        stage = _stage(name)
        section = stage.markdown(result, report.gates) if stage else None
        parts.append(section if section is not None else _metrics_section(report, name))
    return "\n".join(p for p in parts if p)


def _metrics_section(report: Report, stage: str) -> str:
    """The default section of a stage without a markdown hook: its metrics."""
    rows = [{"metric": k, "value": _fmt(v)} for k, v in report.metrics.items()
            if k.startswith(stage + ".")]
    return f"## {stage}\n\n" + _table(rows)


def _budget(budget: StageBudget | None) -> str:
    if budget is None:  # a cached outcome from before budgets, or a stage that never started
        return "—"
    return (f"{budget.memory_gib:g} GiB ({budget.memory_basis}), "
            f"{budget.timeout_s:g} s ({budget.timeout_basis})")


def verdict_table(report: Report) -> str:
    """Plain-text table for the terminal (gates failing first)."""
    rows = gate_rows(report)
    for r in rows:
        if r["result"] == "not evaluated":  # the gate ids would widen every row
            count = r["gate"].count(",") + 1
            r.update(gate=f"{count} gate{'s' * (count > 1)}", result=r["reason"])
        elif r["result"] == "n/a" and r["metric"].endswith(".*"):  # the other kind's gates
            r["result"] = r["reason"]
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in ("gate", "observed", "threshold", "result")}
    lines = [f"{'gate':<{widths['gate']}}  {'observed':>{widths['observed']}}  "
             f"{'threshold':<{widths['threshold']}}  result"]
    for r in rows:
        lines.append(f"{r['gate']:<{widths['gate']}}  {r['observed']:>{widths['observed']}}  "
                     f"{r['threshold']:<{widths['threshold']}}  {r['result']}")
    for err in report.errors:
        lines.append(f"ERROR {err}")
    for problem in report.checkpoint_problems:
        lines.append(f"BROKEN checkpoint: {problem}")
    lines.append(f"verdict: {report.verdict}  ({report.target.label}, {report.source})")
    return "\n".join(lines)


def closing_lines(report: Report, out: str | Path | None = None) -> list[str]:
    """What the CLI prints after the verdict: the stages' findings (e.g. the first divergent
    layer), where report.md is, where the run was published."""
    lines = list(report.findings)
    if out:
        lines.append(f"report: {Path(out) / 'report.md'} (report.json and plots/ next to it)")
    if report.results_uri:
        lines.append(f"results: {report.results_uri}")
    return lines


def plots(report: Report, log=None) -> dict[str, bytes]:
    """PNG per plot of every stage (its `plots` hook, given its evidence), named
    ``<stage>-<name>``. A plot that cannot be drawn is logged and left out, never a failure."""
    out: dict[str, bytes] = {}
    for name, result in report.evidence.items():
        try:
            made = stage.plots(result) if (stage := _stage(name)) else {}
        except Exception as exc:  # a figure is evidence shown, never the verdict
            if log:
                log.warning("stage %s: plots not drawn: %s: %s", name, type(exc).__name__, exc)
            continue
        out.update({f"{name}-{plot}": png for plot, png in made.items()})
    return out


def stage_files(outcomes: dict[str, StageOutcome] | None, log=None) -> dict[str, bytes]:
    """Files of the stages' `files` hooks (e.g. evaluation/<task>.jsonl), from their whole
    results; a hook that raises is logged and its files left out."""
    out: dict[str, bytes] = {}
    for name, outcome in (outcomes or {}).items():
        if not outcome.ok or not outcome.result:
            continue
        try:
            if stage := _stage(name):
                out.update(stage.files(outcome.result))
        except Exception as exc:  # evidence kept aside, never the verdict
            if log:
                log.warning("stage %s: files not written: %s: %s", name, type(exc).__name__, exc)
    return out


def _plot_files(plots_: dict[str, bytes] | None) -> dict[str, bytes]:
    return {f"plots/{name}.png": png for name, png in (plots_ or {}).items()}


def _plot_links(plots_: dict[str, bytes] | None) -> dict[str, str]:
    return {name: f"plots/{name}.png" for name in plots_ or {}}


def write(report: Report, out: str | Path, plots: dict[str, bytes] | None = None,
          files: dict[str, bytes] | None = None) -> tuple[Path, Path]:
    """report.json, report.md, plots/<name>.png and the stages' files under out."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    for name, data in {**_plot_files(plots), **(files or {})}.items():
        write_atomic(out / name, data)  # creates the folder
    write_atomic(json_path, report.model_dump_json(indent=2))
    write_atomic(md_path, to_markdown(report, images=_plot_links(plots)))
    return json_path, md_path


def publish_to_store(report: Report, outcomes: dict[str, StageOutcome] | None = None,
                     log=None, plots: dict[str, bytes] | None = None) -> str | None:
    """report.json, report.md, plots/<name>.png and stages/<stage>.json as one run under the
    results location
    (day0.identity: ``<base>/<model>/<revision>/<target>/runs/<run-id>/``, latest.json naming the
    newest run): for an s3:// source or with DAY0_RESULTS_URI set; sets report.results_uri. A
    store that fails here is logged, never turned into a failed verdict."""
    from day0 import identity

    ident = report.identity or {}
    run_id = ident.get("run_id") or identity.new_run_id()
    try:
        folder = identity.results_location(None, report.source, report.target.name,
                                           ident.get("revision"), ident.get("model"),
                                           weights=ident.get("weights_digest"))
        if folder is None:
            return None
        report.results_uri = identity.run_location(folder, run_id)
        files = {"report.json": report.model_dump_json(indent=2).encode(),
                 "report.md": to_markdown(report, images=_plot_links(plots)).encode(),
                 **_plot_files(plots)}
        for name, outcome in (outcomes or {}).items():
            files[f"stages/{name}.json"] = outcome.model_dump_json(indent=1).encode()
        files.update(stage_files(outcomes, log))
        where = identity.publish_run(files, source=report.source, target_name=report.target.name,
                                     model=ident.get("model"), revision=ident.get("revision"),
                                     run_id=run_id, weights=ident.get("weights_digest"))
    except Day0Error as exc:
        report.results_uri = None
        if log:
            log.error("results not published: %s", exc)
        return None
    if log:
        log.info("results published to %s", where)
    return where
