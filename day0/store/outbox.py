"""The outbox: a run's results that the store could not take, kept until it can.

Publishing (day0.rendering.publish) asks the store again for store.yaml's ``publish.total_s``;
what it still could not publish is kept here, one folder per run::

    <outbox>/<run_id>/manifest.json    where it all goes (Manifest: source, target, model,
                                       revision, weights, results base, endpoint, run id, the
                                       verdict's Prefect state), so publishing needs nothing else
    <outbox>/<run_id>/files/<name>     report.json, report.md, plots/, stages/, as published

An entry is written under a temporary name, synced, and renamed into place: a reader sees a
whole entry or none. ``<outbox>`` is ``$DAY0_OUTBOX_DIR``, else
``${XDG_STATE_HOME:-~/.local/state}/day0/outbox``: state, never a cache that may be cleared.

:func:`drain` publishes the entries whose store answers, oldest run first, with
``identity.publish_run(resume=True)``: a partial earlier attempt is completed, never doubled.
**latest.json never moves backwards**: publish_run replaces it only with a run whose id sorts
after the one it names, and run ids begin with their UTC time (``identity.new_run_id``), so a run
published late keeps its run folder but leaves a newer run's latest.json alone. A drainer
publishes only entries of its own store (the endpoint the run wrote to, ``DAY0_S3_ENDPOINT`` or
``AWS_ENDPOINT_URL``): never someone else's bucket of the same name. One drainer at a time
(a lock file); the others return at once.

A published entry stays (``published_uri`` set) until ``on_published(manifest)`` says its
Prefect flow run shows the verdict (day0.orchestration.outbox), or ``outbox.state_give_up_s``
after it was published.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from day0.atomic import write_atomic
from day0.errors import Day0Error
from day0.store import identity, retry
from day0.store.paths import state_home
from day0.store.s3 import Unreachable, is_s3, parse_s3_uri, safe_segment

OUTBOX_ENV = "DAY0_OUTBOX_DIR"
MANIFEST = "manifest.json"
FILES = "files"
FORMAT = 1


class VerdictState(BaseModel):
    """The Prefect state the run ends in once its report is in the store."""

    model_config = ConfigDict(extra="forbid")

    completed: bool = Field(description="Completed (PASS) when true, else Failed.")
    name: str = Field(description="The verdict: PASS, FAIL, ERROR or BROKEN.")
    message: str = Field(description="The report's headline.")


class Manifest(BaseModel):
    """manifest.json of one outbox entry."""

    model_config = ConfigDict(extra="forbid")

    format: int = Field(FORMAT, description="Outbox format version.")
    run_id: str = Field(description="The run's id (identity.new_run_id): its folder under runs/.")
    source: str = Field(description="The checkpoint validated.")
    target: str = Field(description="The target's name (the results path's last part).")
    model: str | None = Field(description="The release's model name (identity).")
    revision: str | None = Field(description="The release's revision (identity).")
    weights: str | None = Field(description="The weights digest (identity).")
    results_base: str = Field(description="The results base the run used (s3:// or a folder).")
    endpoint: str | None = Field(description=(
        "The S3 endpoint the run wrote to (DAY0_S3_ENDPOINT or AWS_ENDPOINT_URL; None: AWS)."))
    run_uri: str = Field(description="Where the run's folder goes (ends in '/').")
    files: list[str] = Field(description="The files under files/, as named in the run folder.")
    reason: str = Field(description="Why it could not be published when the run ended.")
    kept_at: str = Field(description="UTC time it was kept.")
    flow_run_id: str | None = Field(None, description="The Prefect flow run whose report it is.")
    prefect_api_url: str | None = Field(None, description="The Prefect API that run is on.")
    final_state: VerdictState = Field(description="The verdict's state, to set once published.")
    point_latest: bool = Field(True, description=(
        "Whether latest.json may name this run (not for a partial or interrupted run)."))
    published_uri: str | None = Field(None, description="Set once the files are in the store.")
    published_at: str | None = Field(None, description="UTC time they were published.")


@dataclass
class Entry:
    path: Path
    manifest: Manifest


@dataclass
class Drained:
    """What one drain did, by run id."""

    published: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # removed: published and its state set
    waiting: dict[str, str] = field(default_factory=dict)  # unpublished: why
    busy: bool = False  # another drainer held the outbox


def outbox_dir() -> Path:
    root = os.environ.get(OUTBOX_ENV)
    return Path(root).expanduser() if root else state_home() / "outbox"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def current_endpoint() -> str | None:
    """The S3 endpoint this process writes to (what a manifest records)."""
    value = os.environ.get("DAY0_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
    return value.rstrip("/") if value else None


def _name(name: str) -> str:
    return "/".join(safe_segment(p) for p in str(name).split("/") if p)


def _synced(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())  # a report kept for later must survive a power cut


def keep(files: dict[str, bytes], manifest: Manifest, root: str | Path | None = None) -> Path:
    """Keep one run's files and manifest as <root>/<run_id>/, atomically; its folder."""
    root = Path(root or outbox_dir())
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    named = {_name(n): bytes(d) for n, d in files.items()}
    manifest = manifest.model_copy(update={"files": list(named)})
    tmp = Path(tempfile.mkdtemp(prefix=f".{manifest.run_id}-", dir=root))
    try:
        for name, data in named.items():
            _synced(tmp / FILES / name, data)
        _synced(tmp / MANIFEST, manifest.model_dump_json(indent=1).encode())
        final = root / manifest.run_id
        os.rename(tmp, final)  # fails, keeping nothing, if the run is kept already
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def entries(root: str | Path | None = None) -> list[Entry]:
    """The whole entries, oldest run first (unreadable ones are left where they are)."""
    root = Path(root or outbox_dir())
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.name.startswith(".") or not (path / MANIFEST).is_file():
            continue
        try:
            found.append(Entry(path, Manifest.model_validate_json((path / MANIFEST).read_bytes())))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda e: e.manifest.run_id)


def publish(entry: Entry) -> str:
    """Publish one entry's files (once: botocore's own attempts only); the run folder URI."""
    m = entry.manifest
    files = {name: (entry.path / FILES / name).read_bytes() for name in m.files}
    where = identity.publish_run(files, source=m.source, target_name=m.target, model=m.model,
                                 revision=m.revision, run_id=m.run_id, weights=m.weights,
                                 results_uri=m.results_base, resume=True,
                                 point_latest=m.point_latest)
    return where or m.run_uri


def _ours(m: Manifest) -> bool:
    return not is_s3(m.results_base) or m.endpoint == current_endpoint()


def _store_down(m: Manifest) -> str | None:
    """Why the run's store cannot be published to now (one brief probe); None: it answers."""
    if not is_s3(m.results_base):
        return None  # a folder: publishing says what is wrong, if anything
    return retry.probe(bucket=parse_s3_uri(m.results_base).bucket)


def _given_up(m: Manifest) -> bool:
    published = dt.datetime.fromisoformat(m.published_at) if m.published_at else None
    limit = dt.timedelta(seconds=retry.settings().outbox.state_give_up_s)
    return published is not None and dt.datetime.now(dt.timezone.utc) - published > limit


def remove(entry: Entry) -> None:
    gone = entry.path.with_name(f".gone-{entry.path.name}-{os.getpid()}")
    os.rename(entry.path, gone)  # out of every reader's sight at once
    shutil.rmtree(gone, ignore_errors=True)


_said: dict[str, str] = {}


@contextmanager
def _exclusive(root: Path):
    with open(root / ".drain.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def drain(root: str | Path | None = None, *,
          on_published: Callable[[Manifest], bool] | None = None,
          log: Callable[[str], None] | None = None) -> Drained:
    """Publish what the outbox holds where the store answers (one probe per store first), then
    ask on_published(manifest) - True: the run's Prefect state is right, the entry goes."""
    root = Path(root or outbox_dir())
    out = Drained()
    if not root.is_dir():
        return out
    say = log or (lambda line: None)
    with _exclusive(root) as mine:
        if not mine:
            out.busy = True
            return out
        down: dict[str, str | None] = {}  # per store: why it cannot be published to now
        for entry in entries(root):
            m = entry.manifest
            if m.published_uri is None:
                if not _ours(m):
                    continue
                store = m.endpoint or m.results_base
                if store not in down:
                    down[store] = _store_down(m)
                if down[store]:
                    out.waiting[m.run_id] = down[store]
                    continue
                try:
                    uri = publish(entry)
                except (Day0Error, OSError) as exc:
                    out.waiting[m.run_id] = str(exc)
                    if isinstance(exc, Unreachable):
                        down[store] = str(exc)
                    if _said.get(m.run_id) != str(exc):  # once per reason, not every pass
                        say(f"outbox: run {m.run_id} still not published: {exc}")
                        _said[m.run_id] = str(exc)
                    continue
                m = m.model_copy(update={"published_uri": uri, "published_at": _now()})
                write_atomic(entry.path / MANIFEST, m.model_dump_json(indent=1))
                entry = Entry(entry.path, m)
                out.published.append(m.run_id)
                say(f"outbox: published run {m.run_id} to {uri} (kept since {m.kept_at}: "
                    f"{m.reason})")
            if on_published is None or on_published(m) or _given_up(m):
                remove(entry)
                out.done.append(m.run_id)
    return out


__all__ = ["Manifest", "VerdictState", "Entry", "Drained", "outbox_dir", "keep", "entries",
           "publish", "drain", "remove", "current_endpoint", "OUTBOX_ENV"]
