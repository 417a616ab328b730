"""Performance baselines: a measured run promoted on purpose, what later runs compare with.

Promotion is always explicit: ``day0 validate --promote-baseline`` (the stage's
``promote_baseline``; the deployment's parameter of the same name) or ``day0 baseline promote
RUN_FOLDER`` for a run already published. A baseline is per model, revision and target, one
entry per load run, each with the digest of what was sent (the trace, its arrival, the
engine's context): a run is compared only with a baseline of the same requests. Stored under
the results location (``<results>/<model>/<revision>/<target>/baseline/performance.json``,
object store or folder), else under day0's cache dir; the stage's ``baseline_store`` wins.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

from day0.store import identity, s3
from day0.atomic import write_atomic
from day0.engines.loadgen import LoadRun

FORMAT = 1
NAME = "performance.json"


def run_key(run: LoadRun, context: int) -> str:
    """Digest of the requests of a run and how they arrive."""
    material = {"trace": [e.model_dump() for e in run.trace], "concurrency": run.concurrency,
                "rate": run.rate, "self_timed": run.self_timed, "context": context}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


def location(store: str | None, source: str, revision: str | None, target_name: str) -> str:
    """Folder (ends in '/') or s3:// prefix of this model's and target's baseline."""
    if store:
        return store.rstrip("/") + "/"
    # the weights are hashed only where the location needs them (no results location, or no
    # revision to name the release by)
    folder = identity.results_location(None, source, target_name, revision)
    if folder is not None:
        return folder + "baseline/"
    weights = identity.weights_key(source)
    return str(identity.cache_dir() / "performance-baseline" / weights / target_name) + "/"


def load(where: str, log=None) -> dict | None:
    """The stored baseline, or None (none yet, or unreadable: reported as no baseline). A store
    that cannot answer is asked again (day0.store.retry; log gets a line per wait); one that
    stays down is StoreDown (the stage's ERROR), never "no baseline", which would change the
    verdict."""
    from day0.store.retry import read_optional

    try:
        raw = (read_optional(where + NAME, log=log) if s3.is_s3(where)
               else Path(where + NAME).read_bytes())
        data = json.loads(raw) if raw is not None else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def entries(runs: list[dict], requests: list[dict]) -> dict[str, dict]:
    """Baseline entries of measured runs (rows and requests as JSON); runs with failed
    requests or no figures are left out (a baseline with failures would excuse them)."""
    out = {}
    for row in runs:
        if row.get("error") or row.get("failed") or not row.get("baseline_key"):
            continue
        mine = [r for r in requests if r["run"] == row["run"] and not r.get("error")]
        out[row["run"]] = {"key": row["baseline_key"], "requests": [
            {k: r.get(k) for k in ("ttft_ms", "e2el_ms", "output_tokens")} for r in mine]}
    return out


def save(where: str, runs: dict[str, dict], *, promoted_from: str) -> str:
    """Write the baseline (replacing the runs it names, keeping the others); its URI."""
    current = load(where) or {"format": FORMAT, "runs": {}}
    current["runs"].update(runs)
    current["promoted"] = {"from": promoted_from,
                           "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    raw = json.dumps(current).encode()
    uri = where + NAME
    if s3.is_s3(where):
        s3.put_object(uri, raw)
    else:
        write_atomic(uri, raw)
    return uri
