"""Flow results as JSON under day0's cache dir, and read back without ever unpickling.

Prefect's default result serializer is pickle, and `State.result()` deserializes a record with
whatever serializer the record file itself names, so a planted or tampered file could make a
reader unpickle. The validate flow therefore persists its report with the "json" serializer in
``$DAY0_CACHE_DIR/flow-results`` (``result_storage``), and ``read_report`` reads that file as
plain JSON (no object hook), refusing any record that is not JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

from day0.rendering.labels import NOT_PUBLISHED
from day0.store.identity import cache_dir
from day0.errors import StageError

RESULTS_FOLDER = "flow-results"


def result_storage() -> Path:
    """The folder under day0's cache dir (Prefect makes it an unsaved LocalFileSystem, whose
    records carry absolute keys)."""
    return cache_dir().expanduser().resolve() / RESULTS_FOLDER


def report_of(state) -> dict:
    """report.json of a `validate` run in this process (``validate(..., return_state=True)``):
    its verdict state's data - Failed for FAIL, ERROR and BROKEN, whose result() would raise.
    A run that raised (bad input, a day0 bug) re-raises its exception here."""
    result = state.result(raise_on_failure=False)
    if isinstance(result, BaseException):
        raise result
    return result


def is_verdict(state) -> bool:
    """Whether a final state carries a report: Completed (PASS; any Completed run of the flow
    returned one) or Failed FAIL/ERROR/BROKEN or NOT PUBLISHED (a verdict the results store did
    not take yet) - not a run that crashed, was cancelled or raised before reaching a verdict."""
    if state is None:
        return False
    return state.is_completed() or (state.is_failed() and state.name in (
        "FAIL", "ERROR", "BROKEN", NOT_PUBLISHED))


def read_report(flow_run) -> dict:
    """The report a finished `validate` flow run persisted (any verdict), as a dict.

    Flow results are written bare (the serializer's bytes; the metadata, serializer included,
    lives in the run's state on the server); a full result record (metadata + result) is read
    too. Either way the serializer must be "json" and the bytes are parsed by json.loads."""
    metadata = getattr(flow_run.state, "data", None)
    key = getattr(metadata, "storage_key", None)
    where = f"flow run {flow_run.name} ({flow_run.id})"
    if not key or not Path(key).is_absolute():
        raise StageError(f"{where} has no result file on this machine", field="--deployment",
                         fix="serve the deployment on this machine with the same DAY0_CACHE_DIR")
    kinds = {getattr(getattr(metadata, "serializer", None), "type", None)}
    try:
        data = json.loads(Path(key).read_bytes())
        record = isinstance(data, dict) and set(data) == {"metadata", "result"}
        if record:
            kinds.add(data["metadata"]["serializer"]["type"])
        if kinds != {"json"}:  # judged before the payload is even parsed
            raise StageError(f"result not JSON (serializer {', '.join(sorted(map(str, kinds)))}"
                             f") and day0 never unpickles one: {where}", file=key,
                             fix="rerun it with this day0's validate flow")
        return json.loads(data["result"]) if record else data  # plain JSON: no object hook
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StageError(f"cannot read the result of {where} as JSON: {exc}", file=key,
                         fix="is the deployment served on this machine with the same "
                             "DAY0_CACHE_DIR?") from None


__all__ = ["result_storage", "read_report", "report_of", "is_verdict", "RESULTS_FOLDER"]
