"""``day0 baseline promote RUN_FOLDER``: a run already finished (its ``--out`` folder or its
published run folder) becomes the performance baseline of its model, revision and target."""

from __future__ import annotations

import json
from pathlib import Path

from day0.store import s3
from day0.errors import InputError
from day0.stages.performance import baseline


def _read(folder: str, name: str) -> bytes:
    uri = folder.rstrip("/") + "/" + name
    try:
        return s3.read_object(uri) if s3.is_s3(uri) else Path(uri).read_bytes()
    except (OSError, s3.NoSuchObject):
        raise InputError(f"{name} not found", file=uri,
                         fix="give the folder `day0 validate --out` wrote, or a published run "
                             "folder (<results>/<model>/<revision>/<target>/runs/<run>/)") from None


def promote_run(folder: str, *, store: str | None = None) -> tuple[str, list[str]]:
    """Store the run's measured runs as baseline; (its URI, the promoted run ids)."""
    try:
        report = json.loads(_read(folder, "report.json"))
        perf = report["evidence"]["performance"]
        runs = perf["runs"]
        source, target = report["source"], report["target"]["name"]
        revision = (report.get("identity") or {}).get("revision")
    except (ValueError, KeyError, TypeError):
        raise InputError("report.json has no performance evidence", file=folder,
                         field="evidence.performance",
                         fix="promote a run of an engine target whose performance stage "
                             "ran") from None
    lines = _read(folder, "performance/requests.jsonl").decode().splitlines()
    try:
        requests = [json.loads(line) for line in lines if line.strip()]
    except ValueError:
        raise InputError("unreadable per-request file", file=f"{folder}/performance/requests.jsonl",
                         fix="promote an untouched run folder") from None
    entries = baseline.entries(runs, requests)
    if not entries:
        raise InputError("no run without failed requests to promote", file=folder,
                         field="evidence.performance.runs",
                         fix="rerun the validation; a run with failures is no baseline")
    where = baseline.location(store, source, revision, target)
    uri = baseline.save(where, entries, promoted_from=folder)
    return uri, list(entries)
