"""The SQLite journal: idempotent accept, durability across reopen, prefix generations."""

from __future__ import annotations

import sqlite3
import threading
import time

from day0.receiver.journal import Journal, ReleaseRow


def row(model: str = "acme/m", revision: str = "r1", target: str = "cpu-bf16") -> ReleaseRow:
    return ReleaseRow(model=model, revision=revision, target=target, source="/x", origin="webhook")


def test_accept_is_idempotent_per_model_revision_target(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    assert j.accept([row(), row(target="cpu-fp32")]) == [True, True]
    assert j.accept([row(), row(revision="r2")]) == [False, True]
    assert len(j.releases()) == 3
    assert row().idempotency_key == "day0:acme/m@r1:cpu-bf16"


def test_wal_and_full_sync_are_on(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    assert j._read("PRAGMA journal_mode")[0][0] == "wal"
    assert j._read("PRAGMA synchronous")[0][0] == 2  # FULL


def test_concurrent_accepts_keep_one_row(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    results: list[bool] = []
    lock = threading.Lock()

    def deliver():
        fresh = j.accept([row()])
        with lock:
            results.extend(fresh)

    threads = [threading.Thread(target=deliver) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results.count(True) == 1 and len(results) == 32
    assert len(j.releases()) == 1


def test_committed_rows_survive_an_unclosed_connection(tmp_path):
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    j.accept([row()])
    j.record_objects([("b", "p")])
    # a second, independent connection (what a restarted process sees) without closing the first
    other = sqlite3.connect(str(path))
    assert other.execute("SELECT status FROM releases").fetchall() == [("pending",)]
    again = Journal(path)
    assert [r.model for r in again.due_releases()] == ["acme/m"]
    assert again.due_prefixes() == [("b", "p", 0)]


def test_release_lifecycle(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    j.accept([row(), row(revision="r2")])
    first, second = j.due_releases()
    j.mark_retry(first.id, 60, "ConnectError: down")
    assert [r.id for r in j.due_releases()] == [second.id]
    assert j.stats()["last_submit_error"] == "ConnectError: down"
    j.mark_submitted(second.id, "run-2")
    assert j.stats()["releases"] == {"pending": 1, "submitted": 1, "finished": 0}
    assert [r.attempts for r in j.due_releases(now=j.next_release_due() + 1)] == [1]


def test_prefix_generations_track_unchecked_events(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    gens = j.record_objects([("b", "m"), ("b", "m")])  # config.json and a shard
    assert gens == {("b", "m"): 2}
    j.finish_check("b", "m", 2, "waiting", 1, "waiting for 1 shard", None, [])
    assert j.due_prefixes() == []
    j.record_objects([("b", "m")])
    assert j.due_prefixes() == [("b", "m", 0)]
    fresh = j.finish_check("b", "m", 3, "complete", 0, "complete", "rev", [row("b/m", "rev")])
    assert fresh == [True] and j.prefix("b", "m").state == "complete"
    j.record_objects([("b", "m")])
    j.defer_check("b", "m", 60, "store down")
    failures = sqlite3.connect(str(tmp_path / "j.sqlite")).execute(
        "SELECT failures FROM prefixes WHERE bucket = 'b' AND prefix = 'm'").fetchone()
    assert failures == (1,)
    assert j.due_prefixes() == []  # deferred, still unchecked
    assert j.stats()["prefixes"]["unchecked"] == 1


def test_a_complete_prefix_settles_until_quiet_and_another_file_restarts_it(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    j.record_objects([("b", "m")])
    due = j.settling("b", "m", 30, time.time(), "complete; settling")
    assert due is not None and j.prefix("b", "m").state == "settling"
    assert j.due_prefixes() == [] and j.due_prefixes(now=due + 0.1) == [("b", "m", 0)]
    # tokenizer.json lands: the quiet period starts again; a prefix with nothing pending is untouched
    assert j.touch_pending([("b", "m"), ("b", "other")], 60) == [("b", "m")]
    assert j.due_prefixes(now=due + 0.1) == []
    # only a listing taken once the prefix has been quiet that long may release it: not one
    # read before (a slow check that ends after the quiet period), one read after
    assert j.settling("b", "m", 1, time.time(), "still settling") is not None
    assert j.settling("b", "m", 1, time.time() + 1.5, "quiet") is None


def test_a_journal_from_before_the_settle_window_opens_and_counts_as_quiet(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(str(path))
    db.execute("CREATE TABLE prefixes (bucket TEXT NOT NULL, prefix TEXT NOT NULL, generation"
               " INTEGER NOT NULL DEFAULT 0, checked INTEGER NOT NULL DEFAULT 0, state TEXT NOT NULL"
               " DEFAULT 'new', missing INTEGER, detail TEXT, revision TEXT, failures INTEGER NOT"
               " NULL DEFAULT 0, next_check REAL NOT NULL DEFAULT 0, PRIMARY KEY (bucket, prefix))")
    db.execute("INSERT INTO prefixes (bucket, prefix, generation) VALUES ('b', 'm', 3)")
    db.commit()
    db.close()
    j = Journal(path)
    assert j.due_prefixes() == [("b", "m", 0)] and j.settling("b", "m", 5, time.time(), "x") is None
