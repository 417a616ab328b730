"""The report in the Prefect UI: the run's name and tags, and its artifacts.

Artifacts are created with the flow run's id (never a task's): they hang off the run itself.
Keys come from day0.rendering.labels: ``day0-<kind>-<model>-<target>``, the same key for every run of a
model on a target, so Prefect's Artifacts page shows one history per (model, target), and each
run's Artifacts tab lists its own cards. Plots are markdown artifacts with the PNG inline as a
data: URI: the self-hosted UI renders those (an image artifact or a link to a file would need
the browser to reach the results store).

Nothing here may fail a validation: a Prefect that refuses an update is logged as a warning.
"""

from __future__ import annotations

import base64

from day0.rendering import labels
from day0.verdict import report as reporting
from day0.rendering import report as rendering


def label_run(flow_run_id, logger, *, name: str | None = None, tags: list[str] = ()) -> None:
    """Rename the flow run and set our tags (merged with its others: day0-owner, origin...)."""
    if flow_run_id is None:
        return
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            current = client.read_flow_run(flow_run_id)
            client.update_flow_run(flow_run_id, name=name,
                                   tags=labels.merge_tags(list(current.tags), list(tags)))
    except Exception as exc:
        logger.warning("could not name or tag flow run %s: %s", flow_run_id, exc)


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _summary(report: reporting.Report, where: str) -> str:
    """The report card's subtitle: short (a long unbroken line widens the artifact page past
    the window); the report itself opens with the whole headline."""
    first = next((g.id for g in report.gates
                  if g.applicable and not g.passed and g.severity == "error"), None)
    why = f"; first failing gate {first}" if report.verdict == "FAIL" and first else ""
    return f"day0 {report.verdict}: {where}{why}"


def _title(name: str) -> str:
    return name.replace("-", " ").capitalize()


def publish_artifacts(report: reporting.Report, plots: dict[str, bytes], flow_run_id,
                      logger) -> dict[str, str]:
    """Create the run's artifacts; returns artifact key -> id (what was created)."""
    from prefect.artifacts import MarkdownArtifact, TableArtifact

    model = (report.identity or {}).get("model") or report.source
    target = report.target.name
    revision = (report.identity or {}).get("revision") or "?"
    where = f"{model}@{revision} on {target}"
    uris = {name: data_uri(png) for name, png in plots.items()}
    created: dict[str, str] = {}

    def create(artifact) -> None:
        try:
            created[artifact.key] = str(artifact.create().id)
        except Exception as exc:
            logger.warning("could not create artifact %s: %s", artifact.key, exc)

    create(MarkdownArtifact(
        key=labels.artifact_key("report", model, target), flow_run_id=flow_run_id,
        markdown=rendering.to_markdown(report, images=uris),
        description=_summary(report, where)))
    create(TableArtifact(
        key=labels.artifact_key("gates", model, target), flow_run_id=flow_run_id,
        table=rendering.gate_rows(report, markup=True),
        description=f"Release gates of {where}: failing first; observed vs threshold"))
    for key, (description, rows) in rendering.stage_tables(report).items():
        kind = key.removeprefix("day0-")
        create(TableArtifact(key=labels.artifact_key(kind, model, target),
                             flow_run_id=flow_run_id, table=rows,
                             description=f"{description} ({where})"))
    for name, uri in uris.items():
        create(MarkdownArtifact(
            key=labels.artifact_key(f"plot-{name}", model, target), flow_run_id=flow_run_id,
            markdown=f"## {_title(name)}: {where}, {report.verdict}\n\n![{name}]({uri})\n",
            description=f"Plot {name}: {where} ({report.verdict})"))
    return created


__all__ = ["label_run", "publish_artifacts", "data_uri"]
