"""Where a report goes: report.json, report.md, the stages' plots (``plots/<stage>-<name>.png``)
and files, written to a folder (:func:`write`) or published as one run under the results
location (:func:`publish_to_store`)."""

from __future__ import annotations

from pathlib import Path

from day0.atomic import write_atomic
from day0.errors import Day0Error
from day0.execution.stage import StageOutcome
from day0.verdict import hooks
from day0.verdict.report import Report
from day0.rendering.labels import final_state
from day0.rendering.report import to_markdown


def plots(report: Report, log=None) -> dict[str, bytes]:
    """PNG per plot of every stage (its `plots` hook, given its evidence), named
    ``<stage>-<name>``. A plot that cannot be drawn is a note in the report, left out, never a
    failure."""
    out: dict[str, bytes] = {}
    for name, result in report.evidence.items():
        made = hooks.call(name, "plots", result, default={}, notes=report.notes, log=log)
        out.update({f"{name}-{plot}": png for plot, png in made.items()})
    return out


def stage_files(outcomes: dict[str, StageOutcome] | None, log=None,
                notes: list[str] | None = None) -> dict[str, bytes]:
    """Files of the stages' `files` hooks (e.g. evaluation/<task>.jsonl), from their whole
    results; a hook that raises is a note (notes) and its files left out."""
    out: dict[str, bytes] = {}
    for name, outcome in (outcomes or {}).items():
        if outcome.ok and outcome.result:
            out.update(hooks.call(name, "files", outcome.result, default={}, notes=notes,
                                  log=log))
    return out


def _plot_files(plots_: dict[str, bytes] | None) -> dict[str, bytes]:
    return {f"plots/{name}.png": png for name, png in (plots_ or {}).items()}


def _plot_links(plots_: dict[str, bytes] | None) -> dict[str, str]:
    return {name: f"plots/{name}.png" for name in plots_ or {}}


def write(report: Report, out: str | Path, plots: dict[str, bytes] | None = None,
          files: dict[str, bytes] | None = None) -> tuple[Path, Path]:
    """report.json first (the evidence, before anything is rendered), then report.md,
    plots/<name>.png and the stages' files under out; report.json again when rendering added
    notes (a hook that raised)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    write_atomic(json_path, report.model_dump_json(indent=2))
    notes = len(report.notes)
    write_atomic(md_path, to_markdown(report, images=_plot_links(plots)))
    for name, data in {**_plot_files(plots), **(files or {})}.items():
        write_atomic(out / name, data)  # creates the folder
    if len(report.notes) != notes:
        write_atomic(json_path, report.model_dump_json(indent=2))
    return json_path, md_path


def publish_to_store(report: Report, outcomes: dict[str, StageOutcome] | None = None,
                     log=None, plots: dict[str, bytes] | None = None,
                     flow_run: dict | None = None) -> str | None:
    """report.json, report.md, plots/<name>.png and stages/<stage>.json as one run under the
    results location
    (day0.store.identity: ``<base>/<model>/<revision>/<target>/runs/<run-id>/``, latest.json naming the
    newest full run, never a partial or interrupted one): for an s3:// source or with DAY0_RESULTS_URI set; sets report.results_uri.

    A store that cannot answer is asked again for store.yaml's publish.total_s
    (day0.store.retry); what it still did not take is kept in the outbox (day0.store.outbox,
    published later) and report.unpublished says why and where: the verdict stands, the run is
    "NOT PUBLISHED" (day0.rendering.labels). flow_run: {"id", "api_url"} of the Prefect run,
    for the outbox to set its state once published."""
    from day0.store import identity, retry

    ident = report.identity or {}
    run_id = ident.get("run_id") or identity.new_run_id()
    # a partial or interrupted run is evidence, not the release's verdict: latest.json stays
    newest = not report.partial and not any(
        o.failure == "interrupted" for o in (outcomes or {}).values())
    names = dict(source=report.source, target_name=report.target.name, model=ident.get("model"),
                 revision=ident.get("revision"), run_id=run_id, weights=ident.get("weights_digest"),
                 point_latest=newest)
    try:
        folder = identity.results_location(None, report.source, report.target.name,
                                           ident.get("revision"), ident.get("model"),
                                           weights=ident.get("weights_digest"))
        if folder is None:
            return None
        base = identity.results_base(report.source)
        report.results_uri = identity.run_location(folder, run_id)
        verdict = final_state(report)  # what the run shows once published
        kept = stage_files(outcomes, log, report.notes)  # hooks first: they may add notes
        markdown = to_markdown(report, images=_plot_links(plots)).encode()
        files = {"report.json": report.model_dump_json(indent=2).encode(),
                 "report.md": markdown, **_plot_files(plots)}
        for name, outcome in (outcomes or {}).items():
            files[f"stages/{name}.json"] = outcome.model_dump_json(indent=1).encode()
        files.update(kept)
    except Day0Error as exc:  # nowhere to name: nothing can be kept for later either
        report.results_uri = None
        report.unpublished = f"{exc} (not kept: its results location could not be named)"
        if log:
            log.error("results not published: %s", report.unpublished)
        return None
    warn = (lambda line: log.warning("results store: %s", line)) if log else None
    try:
        where = retry.retrying(lambda: identity.publish_run(files, resume=True, **names),
                               report.results_uri, policy=retry.settings().publish, log=warn)
    except Day0Error as exc:  # its message only: the line must keep where the files are
        report.unpublished = _keep(files, report, exc.problems[0].message, base, verdict,
                                   flow_run or {}, run_id, newest)
        report.results_uri = None
        if log:
            log.error("results not published: %s", report.unpublished)
        return None
    if log:
        log.info("results published to %s", where)
    return where


def _keep(files: dict[str, bytes], report: Report, why: str, base: str, verdict,
          flow_run: dict, run_id: str, newest: bool) -> str:
    """Keep the files in the outbox; report.unpublished's text (why, and where they are)."""
    import datetime as dt

    from day0.store import outbox

    ident = report.identity or {}
    manifest = outbox.Manifest(
        run_id=run_id, source=report.source, target=report.target.name, model=ident.get("model"),
        revision=ident.get("revision"), weights=ident.get("weights_digest"), results_base=base,
        endpoint=outbox.current_endpoint(), run_uri=report.results_uri, files=list(files),
        reason=why, kept_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        flow_run_id=flow_run.get("id"), point_latest=newest,
        prefect_api_url=flow_run.get("api_url"),
        final_state=outbox.VerdictState(completed=verdict.completed, name=verdict.name,
                                        message=verdict.message))
    try:
        where = outbox.keep(files, manifest)
    except (OSError, ValueError) as exc:
        return f"{why}; and it could not be kept in the outbox either: {exc}"
    return (f"{why}; kept in {where}, published to {report.results_uri} once the store answers "
            "(`day0 serve`, `day0 stack up` or the next run)")
