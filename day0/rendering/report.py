"""report.md (people) and the terminal table, from a report (day0.verdict.report). report.md
(and the Prefect report artifact) opens with the verdict and the first failing gate
(:func:`headline`); its gates table lists failing rows first with their severity, and a stage
that did not run is one "not evaluated" row, not a FAIL per gate (:func:`gate_rows`)."""

from __future__ import annotations

import math
from pathlib import Path

from day0.execution.budget import StageBudget
from day0.verdict.gates import GateResult
from day0 import stages
from day0.verdict import hooks
from day0.verdict.report import Report


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
ORDER = {"FAIL": 0, "WARN": 1, "not evaluated": 2, "PASS": 3, "not selected": 4, "n/a": 5}


def _result(g: GateResult) -> str:
    if g.not_selected:
        return "not selected"
    if not g.applicable:
        return "n/a"
    if g.passed:
        return "PASS"
    if g.not_evaluated:
        return "not evaluated"
    return "FAIL" if g.severity == "error" else "WARN"


def gate_rows(report: Report, markup: bool = False) -> list[dict]:
    """The gates, failing first (FAIL, WARN, not evaluated, PASS, not selected, n/a; gates.yaml
    order within), with severity; the gates a stage that did not run left unevaluated, and
    those of a stage a partial run did not select, are one row per stage and reason; the gates of stages that do not run on this kind of target are one counted row,
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
        if result in ("not evaluated", "not selected"):
            if (first := grouped.get(g.not_evaluated or g.not_selected)) is not None:
                first["gate"] += f", {g.id}"
                first["metric"], first["threshold"] = g.metric.split(".")[0] + ".*", "—"
                if g.severity == "error":
                    first["severity"] = "error"
                continue
            grouped[g.not_evaluated or g.not_selected] = row
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


BRING_UP = "bring-up, weights untrained"


def partial_mark(report: Report) -> str:
    """'partial: stages X, Y' for a partial run (the stages it planned), '' for the full plan."""
    return f"partial: stages {', '.join(report.partial)}" if report.partial else ""


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
               else report.errors[0] if report.errors else "a stage could not finish")
    elif verdict == "FAIL":
        first = next((g for g in failing if g.severity == "error"), None)
        why = "first failing gate " + (
            "?" if first is None else f"{first.id} {first.reason}" if first.not_evaluated
            else f"{first.id} ({first.metric}: {first.reason})")
    else:
        applicable = sum(g.applicable for g in report.gates)
        why = (f"{applicable - len(failing)} of {applicable} gates hold; warnings: "
               + ", ".join(g.id for g in failing)) if failing else f"all {applicable} gates hold"
    if report.partial:
        why = f"{partial_mark(report)}; {why}"
    if report.bring_up:
        why = f"{BRING_UP} (not a release verdict); {why}"
    return "; ".join([f"{verdict}: {why}", *report.findings])


def stage_tables(report: Report) -> dict[str, tuple[str, list[dict]]]:
    """Extra tables the stages show (their `tables` hook): artifact key -> (description, rows);
    a hook that raises is a note in the report (day0.verdict.hooks), its tables left out."""
    out: dict[str, tuple[str, list[dict]]] = {}
    for name, result in report.evidence.items():
        out.update(hooks.call(name, "tables", result, default={}, notes=report.notes))
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
    marks = [m for m in (BRING_UP if report.bring_up else "", partial_mark(report)) if m]
    title = f"{report.verdict} ({'; '.join(marks)})" if marks else report.verdict
    parts = [f"# day0 validation: {title}\n", f"**{first}**: {rest}\n"]
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
        f"- exit code: {report.exit_code}"
        + (" (a stage refused its input or config: see Errors)" if report.exit_code == 2 else ""),
        f"- created: {report.created_at}, day0 {report.day0_version}\n",
    ]
    if report.results_uri:
        parts.insert(-1, f"- results: `{report.results_uri}`")
    if report.unpublished:  # the local report.md and the Prefect artifact say where it waits
        parts.insert(-1, f"- **not published**: {report.unpublished}")
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
        # a section that cannot be rendered is a note (report.notes), its metrics shown instead
        section = hooks.call(name, "markdown", result, report.gates, default=None,
                             notes=report.notes)
        parts.append(section if isinstance(section, str) else _metrics_section(report, name))
    if report.notes:  # last: the notes of every section above included
        parts += ["## Notes\n"] + [f"- {n}" for n in report.notes] + [""]
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
        if r["result"] in ("not evaluated", "not selected"):  # ids would widen every row
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
    mark = f" ({BRING_UP}: not a release verdict)" if report.bring_up else ""
    mark += f" ({partial_mark(report)})" if report.partial else ""
    lines.append(f"verdict: {report.verdict}{mark}  ({report.target.label}, {report.source})")
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
