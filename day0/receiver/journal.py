"""The receiver's durable journal: SQLite in WAL mode with synchronous=FULL.

Every write that acknowledges a sender is committed (and so fsync'd) before the HTTP answer, so
a receiver killed at any moment loses nothing it acknowledged. Tables:

- releases: one row per run of a release on a target, (model, revision, target, seq) UNIQUE;
  status pending -> submitted (with the Prefect flow run id) -> finished (its run reached a
  final state, as the worker reads it from Prefect). An announcement of a release whose latest
  row is pending or submitted is a duplicate (merged: `announced_at` records it); once that row
  is finished, it is a new row with seq + 1 - a new run, kept next to the earlier ones. An
  announcement that came after the run's end but before the worker saw it end is not lost:
  finishing a row whose `announced_at` is later than the run's end adds the next row then.
  Each row's Prefect idempotency key is day0.store.identity.dedupe_key(..., seq).
  A run that crashed (its process died: no verdict) finishes its row with `crashed` set and
  adds the next row at once, `reruns` + 1, up to the receiver's submit.crash_attempts; the
  last one that crashes leaves `last_error` naming every attempt.
- prefixes: one row per (bucket, prefix) that may hold a checkpoint; `generation` counts the
  events recorded, `checked` the generation the last completeness check covered, so a
  prefix with generation > checked still needs a check (also after a restart).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from day0.errors import ConfigError, JournalError
from day0.store.identity import dedupe_key

RELEASES = """
CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY,
    model TEXT NOT NULL,
    revision TEXT NOT NULL,
    target TEXT NOT NULL,
    seq INTEGER NOT NULL DEFAULT 1,
    source TEXT NOT NULL,
    origin TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    flow_run_id TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL NOT NULL DEFAULT 0,
    last_error TEXT,
    accepted_at REAL NOT NULL,
    submitted_at REAL,
    announced_at REAL,
    announced_source TEXT,
    announced_origin TEXT,
    finished_at REAL,
    reruns INTEGER NOT NULL DEFAULT 0,
    crashed TEXT,
    verdict_uri TEXT,
    UNIQUE (model, revision, target, seq)
);
"""
# the columns a journal written before `seq` existed had (UNIQUE (model, revision, target))
V1_COLUMNS = ("id, model, revision, target, source, origin, status, flow_run_id, attempts, "
              "next_attempt, last_error, accepted_at, submitted_at")
GAVE_UP = "ERROR: gave up"  # how a release's last_error starts once its crashed runs are given up
SCHEMA = RELEASES + """
CREATE INDEX IF NOT EXISTS releases_pending ON releases (status, next_attempt);
CREATE TABLE IF NOT EXISTS prefixes (
    bucket TEXT NOT NULL,
    prefix TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    checked INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'new',
    missing INTEGER,
    detail TEXT,
    revision TEXT,
    failures INTEGER NOT NULL DEFAULT 0,
    next_check REAL NOT NULL DEFAULT 0,
    last_event REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (bucket, prefix)
);
"""


@dataclass(frozen=True)
class ReleaseRow:
    model: str
    revision: str
    target: str
    source: str
    origin: str
    id: int | None = None
    attempts: int = 0
    seq: int = 1

    @property
    def idempotency_key(self) -> str:
        return dedupe_key(self.model, self.revision, self.target, self.seq)


@dataclass(frozen=True)
class PrefixState:
    bucket: str
    prefix: str
    generation: int
    checked: int
    state: str
    missing: int | None
    detail: str | None
    revision: str | None


def hold_lock(path: str | Path) -> int:
    """Lock `<journal>.lock` for the life of this process (the fd is returned, never closed):
    two receivers on one journal would both submit its releases. ConfigError when another
    process holds it."""
    lock = Path(str(path) + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ConfigError(f"journal {path} is in use by another receiver (pid {holder})",
                          field="journal", fix="give each receiver its own journal") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


@contextlib.contextmanager
def _unavailable():
    """SQLite failures (disk full, locked past busy_timeout, corrupt) as day0's JournalError:
    the app answers 503 + Retry-After, the worker retries its pass."""
    try:
        yield
    except sqlite3.Error as exc:
        raise JournalError(f"journal unavailable ({type(exc).__name__})") from exc


class Journal:
    """Thread-safe: one connection, one lock; every public write is one committed transaction."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                   timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=30000")
        with self._lock:
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(releases)")}
            if columns and "seq" not in columns:
                self._migrate_v1()
            self._db.executescript(SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(releases)")}
            for column, kind in (("reruns", "INTEGER NOT NULL DEFAULT 0"), ("crashed", "TEXT"),
                                 ("verdict_uri", "TEXT")):
                if column not in columns:  # a journal from before crashed runs were run again
                    self._db.execute(f"ALTER TABLE releases ADD COLUMN {column} {kind}")
            if "last_event" not in {row[1] for row in self._db.execute("PRAGMA table_info(prefixes)")}:
                # a journal from before the settle window: its prefixes count as quiet
                self._db.execute("ALTER TABLE prefixes ADD COLUMN last_event REAL NOT NULL DEFAULT 0")

    def _migrate_v1(self) -> None:
        """A journal from before runs were kept: its rows become each release's first run."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("ALTER TABLE releases RENAME TO releases_v1")
            db.execute(RELEASES)
            db.execute(f"INSERT INTO releases ({V1_COLUMNS}) SELECT {V1_COLUMNS} FROM releases_v1")
            db.execute("DROP TABLE releases_v1")  # and its index, recreated by SCHEMA
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, fn) -> Any:
        with self._lock, _unavailable():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock, _unavailable():
            return self._db.execute(sql, args).fetchall()

    # ---- releases ------------------------------------------------------------------------

    @staticmethod
    def _insert_releases(db: sqlite3.Connection, rows: list[ReleaseRow], now: float) -> list[bool]:
        fresh = []
        for r in rows:
            last = db.execute(
                "SELECT id, seq, status FROM releases WHERE model = ? AND revision = ? AND target = ?"
                " ORDER BY seq DESC LIMIT 1", (r.model, r.revision, r.target)).fetchone()
            if last is not None and last[2] != "finished":  # its run is pending or running
                db.execute("UPDATE releases SET announced_at = ?, announced_source = ?,"
                           " announced_origin = ? WHERE id = ?", (now, r.source, r.origin, last[0]))
                fresh.append(False)
                continue
            db.execute("INSERT INTO releases (model, revision, target, seq, source, origin, accepted_at)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?)", (r.model, r.revision, r.target,
                                                        last[1] + 1 if last else 1, r.source,
                                                        r.origin, now))
            fresh.append(True)
        return fresh

    def accept(self, rows: list[ReleaseRow]) -> list[bool]:
        """Insert releases; True for each that starts a run (False: a duplicate of one pending or
        running)."""
        now = time.time()
        return self._write(lambda db: self._insert_releases(db, rows, now))

    def due_releases(self, limit: int = 100, now: float | None = None) -> list[ReleaseRow]:
        rows = self._read(
            "SELECT id, model, revision, target, source, origin, attempts, seq FROM releases"
            " WHERE status = 'pending' AND next_attempt <= ? ORDER BY id LIMIT ?",
            (time.time() if now is None else now, limit))
        return [ReleaseRow(model=m, revision=r, target=t, source=s, origin=o, id=i, attempts=a,
                           seq=q) for i, m, r, t, s, o, a, q in rows]

    def next_release_due(self) -> float | None:
        rows = self._read("SELECT MIN(next_attempt) FROM releases WHERE status = 'pending'")
        return rows[0][0]

    def mark_submitted(self, release_id: int, flow_run_id: str) -> None:
        now = time.time()
        self._write(lambda db: db.execute(
            "UPDATE releases SET status = 'submitted', flow_run_id = ?, submitted_at = ?,"
            " attempts = attempts + 1, last_error = NULL WHERE id = ?", (flow_run_id, now, release_id)))

    def mark_retry(self, release_id: int, delay_s: float, error: str) -> None:
        when = time.time() + delay_s
        self._write(lambda db: db.execute(
            "UPDATE releases SET attempts = attempts + 1, next_attempt = ?, last_error = ?"
            " WHERE id = ?", (when, error[:2000], release_id)))

    def active_runs(self, limit: int = 200, after_id: int = 0) -> list[tuple[int, str]]:
        """(id, flow run id) of submitted releases whose run has not been seen to end, by id."""
        return [tuple(r) for r in self._read(
            "SELECT id, flow_run_id FROM releases WHERE status = 'submitted' AND id > ?"
            " ORDER BY id LIMIT ?", (after_id, limit))]

    def finish_runs(self, ended: dict[int, float], crashed: dict[int, str] | None = None,
                    attempts: int = 3) -> int:
        """Mark releases finished, by id -> end time of their run (epoch s). A run in crashed
        (id -> why) gets its release run again while fewer than `attempts` runs of it crashed
        in a row; else the row keeps why it gave up. A release announced again after its run's
        end gets its next run. Returns how many runs were added."""
        now, crashed = time.time(), crashed or {}

        def fn(db: sqlite3.Connection) -> int:
            added = 0
            for release_id, end in ended.items():
                row = db.execute(
                    "SELECT model, revision, target, seq, source, origin, announced_at,"
                    " announced_source, announced_origin, reruns, flow_run_id FROM releases"
                    " WHERE id = ? AND status = 'submitted'", (release_id,)).fetchone()
                if row is None:
                    continue
                (model, revision, target, seq, source, origin, announced, a_source, a_origin,
                 reruns, run_id) = row
                why = crashed.get(release_id)
                db.execute("UPDATE releases SET status = 'finished', finished_at = ?, crashed = ?"
                           " WHERE id = ?", (end, why, release_id))
                again = why is not None and reruns + 1 < attempts
                if why is not None and not again:
                    runs = [r for (r,) in db.execute(
                        "SELECT flow_run_id FROM releases WHERE model = ? AND revision = ? AND"
                        " target = ? AND seq > ? ORDER BY seq", (model, revision, target,
                                                                  seq - reruns - 1))]
                    db.execute("UPDATE releases SET last_error = ? WHERE id = ?", (
                        f"{GAVE_UP} after {reruns + 1} crashed run(s) ({', '.join(runs)});"
                        f" the last: {why}"[:2000], release_id))
                if again or (announced is not None and announced > end):  # clocks: receiver vs Prefect
                    cur = db.execute(
                        "INSERT OR IGNORE INTO releases (model, revision, target, seq, source,"
                        " origin, accepted_at, reruns, last_error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (model, revision, target, seq + 1, a_source or source, a_origin or origin,
                         announced or now, reruns + 1 if again else 0,
                         f"run {run_id} crashed: {why}"[:2000] if again else None))
                    added += cur.rowcount
            return added

        return self._write(fn)

    def gave_up(self, release_ids: list[int]) -> list[dict]:
        """Those of release_ids whose crashed run was the last attempt (no next row)."""
        if not release_ids:
            return []
        cols = ("id", "model", "revision", "target", "last_error")
        rows = self._read(
            f"SELECT {', '.join(cols)} FROM releases WHERE id IN"
            f" ({', '.join('?' * len(release_ids))}) AND last_error LIKE ?",
            (*release_ids, GAVE_UP + "%"))
        return [dict(zip(cols, row)) for row in rows]

    def verdicts_to_publish(self, limit: int = 20) -> list[dict]:
        """Releases given up on (gave_up) whose ERROR verdict is not published yet, oldest first;
        after a restart too."""
        cols = ("id", "model", "revision", "target", "source", "last_error")
        rows = self._read(
            f"SELECT {', '.join(cols)} FROM releases WHERE status = 'finished' AND verdict_uri IS"
            " NULL AND last_error LIKE ? ORDER BY id LIMIT ?", (GAVE_UP + "%", limit))
        return [dict(zip(cols, row)) for row in rows]

    def verdict_published(self, release_id: int, where: str) -> None:
        """The given-up release's ERROR verdict is in the results store (or its outbox): where."""
        self._write(lambda db: db.execute("UPDATE releases SET verdict_uri = ? WHERE id = ?",
                                          (where[:2000], release_id)))

    def releases(self) -> list[dict]:
        cols = ("id", "model", "revision", "target", "seq", "source", "origin", "status",
                "flow_run_id", "attempts", "last_error", "accepted_at", "submitted_at",
                "announced_at", "finished_at", "reruns", "crashed", "verdict_uri")
        rows = self._read(f"SELECT {', '.join(cols)} FROM releases ORDER BY id")
        return [dict(zip(cols, row)) for row in rows]

    # ---- object-store events -------------------------------------------------------------

    def record_objects(self, prefixes: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Count one event per (bucket, prefix) (the store, not the event, is asked whether a
        checkpoint is complete); returns each prefix's new generation."""

        now = time.time()

        def fn(db: sqlite3.Connection) -> dict[tuple[str, str], int]:
            out = {}
            for bucket, prefix in prefixes:
                db.execute("INSERT INTO prefixes (bucket, prefix, generation, last_event)"
                           " VALUES (?, ?, 1, ?) ON CONFLICT (bucket, prefix) DO UPDATE SET"
                           " generation = generation + 1, next_check = 0, last_event = ?",
                           (bucket, prefix, now, now))
                (gen,) = db.execute("SELECT generation FROM prefixes WHERE bucket = ? AND prefix = ?",
                                    (bucket, prefix)).fetchone()
                out[(bucket, prefix)] = gen
            return out

        return self._write(fn)

    def prefix(self, bucket: str, prefix: str) -> PrefixState | None:
        rows = self._read("SELECT generation, checked, state, missing, detail, revision FROM prefixes"
                          " WHERE bucket = ? AND prefix = ?", (bucket, prefix))
        return PrefixState(bucket, prefix, *rows[0]) if rows else None

    def finish_check(self, bucket: str, prefix: str, generation: int, state: str,
                     missing: int | None, detail: str, revision: str | None,
                     releases: list[ReleaseRow]) -> list[bool]:
        """Store a check's outcome for `generation` and insert its releases, atomically."""
        now = time.time()

        def fn(db: sqlite3.Connection) -> list[bool]:
            db.execute("UPDATE prefixes SET checked = MAX(checked, ?), state = ?, missing = ?,"
                       " detail = ?, revision = ?, failures = 0, next_check = 0"
                       " WHERE bucket = ? AND prefix = ?",
                       (generation, state, missing, detail, revision, bucket, prefix))
            return self._insert_releases(db, releases, now)

        return self._write(fn)

    def touch_pending(self, prefixes: list[tuple[str, str]], quiet_s: float) -> list[tuple[str, str]]:
        """Another file landed under prefixes still waiting or settling (tokenizer.json after
        the index): restart their quiet period; returns the prefixes touched."""
        now = time.time()

        def fn(db: sqlite3.Connection) -> list[tuple[str, str]]:
            out = []
            for bucket, prefix in prefixes:
                cur = db.execute("UPDATE prefixes SET last_event = ?, next_check = MAX(next_check, ?)"
                                 " WHERE bucket = ? AND prefix = ? AND generation > checked",
                                 (now, now + quiet_s, bucket, prefix))
                if cur.rowcount:
                    out.append((bucket, prefix))
            return out

        return self._write(fn)

    def settling(self, bucket: str, prefix: str, quiet_s: float, listed_at: float,
                 detail: str) -> float | None:
        """Unless the listing a check read (at `listed_at`) was taken once the prefix had been
        quiet for `quiet_s` after its newest event: mark it settling, due again at that time,
        and return the time; None when the listing already covers a quiet prefix."""

        def fn(db: sqlite3.Connection) -> float | None:
            (last,) = db.execute("SELECT last_event FROM prefixes WHERE bucket = ? AND prefix = ?",
                                 (bucket, prefix)).fetchone()
            due = last + quiet_s
            if due <= listed_at:
                return None
            db.execute("UPDATE prefixes SET state = 'settling', detail = ?, failures = 0,"
                       " next_check = ? WHERE bucket = ? AND prefix = ?",
                       (detail[:2000], due, bucket, prefix))
            return due

        return self._write(fn)

    def defer_check(self, bucket: str, prefix: str, delay_s: float, error: str) -> None:
        """The store could not be read: count the failure and retry later."""
        when = time.time() + delay_s
        self._write(lambda db: db.execute(
            "UPDATE prefixes SET failures = failures + 1, next_check = ?, state = 'error', detail = ?"
            " WHERE bucket = ? AND prefix = ?", (when, error[:2000], bucket, prefix)))

    def due_prefixes(self, now: float | None = None, limit: int = 1000) -> list[tuple[str, str, int]]:
        """Prefixes with events no check has covered yet, as (bucket, prefix, failures), the
        longest-waiting first, at most `limit`."""
        return [tuple(r) for r in self._read(
            "SELECT bucket, prefix, failures FROM prefixes WHERE generation > checked"
            " AND next_check <= ? ORDER BY next_check, bucket, prefix LIMIT ?",
            (time.time() if now is None else now, limit))]

    def next_check_due(self) -> float | None:
        return self._read("SELECT MIN(next_check) FROM prefixes WHERE generation > checked")[0][0]

    # ---- statistics ----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        by_status = dict(self._read("SELECT status, COUNT(*) FROM releases GROUP BY status"))
        by_state = dict(self._read("SELECT state, COUNT(*) FROM prefixes GROUP BY state"))
        unchecked = self._read("SELECT COUNT(*) FROM prefixes WHERE generation > checked")[0][0]
        last_error = self._read("SELECT last_error FROM releases WHERE status = 'pending'"
                                " AND last_error IS NOT NULL ORDER BY id DESC LIMIT 1")
        crashed = self._read("SELECT COUNT(*) FROM releases WHERE crashed IS NOT NULL")[0][0]
        return {"releases": {"pending": by_status.get("pending", 0),
                             "submitted": by_status.get("submitted", 0),
                             "finished": by_status.get("finished", 0)},
                "prefixes": {**by_state, "unchecked": unchecked},
                "crashed_runs": crashed,
                "last_submit_error": last_error[0][0] if last_error else None}
