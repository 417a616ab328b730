"""The journal keeps one run per announcement of a release once the earlier run has ended:
duplicates merge while a run is pending or running, history is kept after (day0.store.identity)."""

from __future__ import annotations

import sqlite3
import time

from day0.receiver.journal import Journal, ReleaseRow


def row(origin: str = "webhook", source: str = "s3://models/acme/m") -> ReleaseRow:
    return ReleaseRow(model="acme/m", revision="r1", target="cpu-bf16", source=source, origin=origin)


def submit(j: Journal, run: str) -> ReleaseRow:
    (due,) = j.due_releases()
    j.mark_submitted(due.id, run)
    return due


def test_duplicates_merge_until_the_run_ends_then_a_new_run(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    assert j.accept([row(origin="s3")]) == [True]
    assert j.accept([row()]) == [False]  # upload + webhook of one release, run pending
    first = submit(j, "run-1")
    assert first.seq == 1 and first.idempotency_key == "day0:acme/m@r1:cpu-bf16"
    assert j.accept([row()]) == [False]  # a redelivery while it runs
    assert j.active_runs() == [(first.id, "run-1")]
    # the run ended after the last announcement: nothing more to do
    assert j.finish_runs({first.id: time.time() + 1}) == 0
    assert j.active_runs() == [] and j.due_releases() == []
    # announced again after it ended: a new run, with its own key (Prefect keeps old keys)
    assert j.accept([row(origin="s3")]) == [True]
    second = submit(j, "run-2")
    assert (second.seq, second.origin) == (2, "s3")
    assert second.idempotency_key == "day0:acme/m@r1:cpu-bf16#2"
    assert [r["status"] for r in j.releases()] == ["finished", "submitted"]
    assert j.stats()["releases"] == {"pending": 0, "submitted": 1, "finished": 1}


def test_an_announcement_after_the_end_but_before_it_was_seen_is_not_lost(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    j.accept([row(origin="s3")])
    first = submit(j, "run-1")
    ended = time.time()
    time.sleep(0.01)
    assert j.accept([row(origin="webhook", source="s3://models/acme/m/")]) == [False]
    assert j.finish_runs({first.id: ended}) == 1  # the worker saw the end only now
    (nxt,) = j.due_releases()
    assert (nxt.seq, nxt.origin, nxt.source) == (2, "webhook", "s3://models/acme/m/")
    assert j.finish_runs({first.id: ended}) == 0  # finishing twice adds nothing


def test_a_journal_from_before_seq_is_migrated(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(str(path))
    db.executescript("""
        CREATE TABLE releases (id INTEGER PRIMARY KEY, model TEXT NOT NULL, revision TEXT NOT NULL,
            target TEXT NOT NULL, source TEXT NOT NULL, origin TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending', flow_run_id TEXT,
            attempts INTEGER NOT NULL DEFAULT 0, next_attempt REAL NOT NULL DEFAULT 0,
            last_error TEXT, accepted_at REAL NOT NULL, submitted_at REAL,
            UNIQUE (model, revision, target));
        CREATE INDEX releases_pending ON releases (status, next_attempt);
        INSERT INTO releases (model, revision, target, source, origin, status, flow_run_id,
            accepted_at) VALUES ('acme/m', 'r1', 'cpu-bf16', 's3://models/acme/m', 'webhook',
            'submitted', 'run-1', 1.0);
    """)
    db.commit()
    db.close()
    j = Journal(path)
    (old,) = j.releases()
    assert (old["seq"], old["status"], old["flow_run_id"]) == (1, "submitted", "run-1")
    assert j.accept([row()]) == [False]
    j.finish_runs({old["id"]: time.time() + 1})
    assert j.accept([row()]) == [True] and j.due_releases()[0].seq == 2
    assert Journal(path).stats()["releases"]["finished"] == 1  # reopening migrates nothing twice


def test_a_crashed_run_is_run_again_up_to_the_attempts_then_named(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    j.accept([row(origin="s3")])
    first = submit(j, "run-1")
    assert j.accept([row()]) == [False]  # re-uploaded while the run is stuck: merged ...
    # ... and not dropped when that run ends Crashed: the release runs again at once
    assert j.finish_runs({first.id: time.time()}, {first.id: "worker died"}, attempts=3) == 1
    second = submit(j, "run-2")
    assert (second.seq, second.source) == (2, "s3://models/acme/m")
    assert j.finish_runs({second.id: time.time()}, {second.id: "again"}, attempts=3) == 1
    third = submit(j, "run-3")
    assert j.finish_runs({third.id: time.time()}, {third.id: "and again"}, attempts=3) == 0
    assert j.due_releases() == [] and j.stats()["crashed_runs"] == 3
    (last,) = j.gave_up([third.id])
    assert last["last_error"] == ("ERROR: gave up after 3 crashed run(s) (run-1, run-2, run-3); "
                                  "the last: and again")
    assert j.gave_up([first.id, second.id]) == []
    # its ERROR verdict is still to be published (after a restart too), then never again
    (due,) = Journal(tmp_path / "j.sqlite").verdicts_to_publish()
    assert (due["id"], due["source"]) == (third.id, "s3://models/acme/m")
    j.verdict_published(third.id, "s3://models/day0-results/acme/m/rev/cpu-bf16/runs/x/")
    assert j.verdicts_to_publish() == [] and j.releases()[2]["verdict_uri"].endswith("/x/")
    # a verdict resets the count: a later announcement starts from its first attempt
    assert j.accept([row()]) == [True]
    fourth = submit(j, "run-4")
    assert j.finish_runs({fourth.id: time.time()}, {fourth.id: "died"}, attempts=3) == 1
    assert [r["reruns"] for r in j.releases()] == [0, 1, 2, 0, 1]


def test_a_verdict_is_never_run_again(tmp_path):
    j = Journal(tmp_path / "j.sqlite")
    j.accept([row()])
    first = submit(j, "run-1")
    assert j.finish_runs({first.id: time.time() + 1}, {}, attempts=3) == 0
    assert j.due_releases() == [] and j.releases()[0]["crashed"] is None


def test_a_journal_from_before_reruns_gets_the_columns(tmp_path):
    path = tmp_path / "v2.sqlite"
    Journal(path).close()
    db = sqlite3.connect(str(path))
    db.executescript("ALTER TABLE releases DROP COLUMN reruns; ALTER TABLE releases DROP COLUMN crashed;")
    db.close()
    j = Journal(path)
    j.accept([row()])
    first = submit(j, "run-1")
    assert j.finish_runs({first.id: time.time()}, {first.id: "died"}) == 1
