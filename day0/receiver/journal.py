"""The receiver's durable journal: SQLite in WAL mode with synchronous=FULL.

Every write that acknowledges a sender is committed (and so fsync'd) before the HTTP answer, so
a receiver killed at any moment loses nothing it acknowledged. Tables:

- releases: one row per (model, revision, target) -- the UNIQUE key *is* the idempotency of
  the whole receiver; status pending -> submitted (with the Prefect flow run id).
- prefixes: one row per (bucket, prefix) that may hold a checkpoint; `generation` counts the
  events recorded, `checked` the generation the last completeness check covered, so a
  prefix with generation > checked still needs a check (also after a restart).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY,
    model TEXT NOT NULL,
    revision TEXT NOT NULL,
    target TEXT NOT NULL,
    source TEXT NOT NULL,
    origin TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    flow_run_id TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL NOT NULL DEFAULT 0,
    last_error TEXT,
    accepted_at REAL NOT NULL,
    submitted_at REAL,
    UNIQUE (model, revision, target)
);
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

    @property
    def idempotency_key(self) -> str:
        return f"day0:{self.model}@{self.revision}:{self.target}"


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
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, fn) -> Any:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- releases ------------------------------------------------------------------------

    @staticmethod
    def _insert_releases(db: sqlite3.Connection, rows: list[ReleaseRow], now: float) -> list[bool]:
        fresh = []
        for r in rows:
            cur = db.execute(
                "INSERT OR IGNORE INTO releases (model, revision, target, source, origin, accepted_at)"
                " VALUES (?, ?, ?, ?, ?, ?)", (r.model, r.revision, r.target, r.source, r.origin, now))
            fresh.append(cur.rowcount == 1)
        return fresh

    def accept(self, rows: list[ReleaseRow]) -> list[bool]:
        """Insert releases; True for each that is new (False: already known, a duplicate)."""
        now = time.time()
        return self._write(lambda db: self._insert_releases(db, rows, now))

    def due_releases(self, limit: int = 100, now: float | None = None) -> list[ReleaseRow]:
        rows = self._read(
            "SELECT id, model, revision, target, source, origin, attempts FROM releases"
            " WHERE status = 'pending' AND next_attempt <= ? ORDER BY id LIMIT ?",
            (time.time() if now is None else now, limit))
        return [ReleaseRow(model=m, revision=r, target=t, source=s, origin=o, id=i, attempts=a)
                for i, m, r, t, s, o, a in rows]

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

    def releases(self) -> list[dict]:
        cols = ("id", "model", "revision", "target", "source", "origin", "status", "flow_run_id",
                "attempts", "last_error", "accepted_at", "submitted_at")
        rows = self._read(f"SELECT {', '.join(cols)} FROM releases ORDER BY id")
        return [dict(zip(cols, row)) for row in rows]

    # ---- object-store events -------------------------------------------------------------

    def record_objects(self, prefixes: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Count one event per (bucket, prefix) (the store, not the event, is asked whether a
        checkpoint is complete); returns each prefix's new generation."""

        def fn(db: sqlite3.Connection) -> dict[tuple[str, str], int]:
            out = {}
            for bucket, prefix in prefixes:
                db.execute("INSERT INTO prefixes (bucket, prefix, generation) VALUES (?, ?, 1)"
                           " ON CONFLICT (bucket, prefix) DO UPDATE SET generation = generation + 1,"
                           " next_check = 0", (bucket, prefix))
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
        return {"releases": {"pending": by_status.get("pending", 0),
                             "submitted": by_status.get("submitted", 0)},
                "prefixes": {**by_state, "unchecked": unchecked},
                "last_submit_error": last_error[0][0] if last_error else None}
