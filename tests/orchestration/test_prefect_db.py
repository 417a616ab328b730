"""day0.orchestration.prefect_db: a new server home starts from a migrated database kept once per
machine and Prefect version; only a database holding nothing but what a start writes is kept,
an existing database is never replaced, and a server on another database is left alone.
Real SQLite files (the schema shape of Prefect's own)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from importlib.metadata import version

import pytest

from day0.orchestration import prefect_db


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache" / "day0" / "prefect-db"


def started_database(home, *, flow_runs: int = 0):
    """A database as a server leaves it when it first answers (plus flow_runs runs)."""
    home.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(home / "prefect.db")) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript("""
            CREATE TABLE alembic_version (version_num TEXT);
            INSERT INTO alembic_version VALUES ('abc123');
            CREATE TABLE block_type (id TEXT, name TEXT);
            INSERT INTO block_type VALUES ('1', 'secret');
            CREATE TABLE flow_run (id TEXT);""")
        db.executemany("INSERT INTO flow_run VALUES (?)", [(str(i),) for i in range(flow_runs)])
        db.commit()
    return home / "prefect.db"


def rows(path, table):
    with closing(sqlite3.connect(path)) as db:
        return db.execute(f"SELECT * FROM {table}").fetchall()


def test_the_first_started_database_is_kept_and_seeds_the_next_home(tmp_path, cache):
    started_database(tmp_path / "first")
    assert prefect_db.template() == cache / f"{version('prefect')}.db"
    assert prefect_db.keep(tmp_path / "first", {})
    assert rows(prefect_db.template(), "block_type") == [("1", "secret")]
    assert not list(cache.glob("*.partial"))
    assert prefect_db.seed(tmp_path / "second", {})
    assert rows(tmp_path / "second" / "prefect.db", "alembic_version") == [("abc123",)]
    assert not prefect_db.keep(tmp_path / "second", {})  # one template: the first stays


def test_a_database_with_runs_is_never_kept(tmp_path, cache):
    started_database(tmp_path / "used", flow_runs=2)
    assert not prefect_db.keep(tmp_path / "used", {})
    assert not prefect_db.template().exists() and not list(cache.glob("*"))
    with closing(sqlite3.connect(tmp_path / "plain.db")) as db:  # no migrations at all
        db.execute("CREATE TABLE t (x)")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain.db").rename(tmp_path / "plain" / "prefect.db")
    assert not prefect_db.keep(tmp_path / "plain", {})


def test_an_existing_database_or_another_connection_is_left_alone(tmp_path, cache):
    started_database(tmp_path / "first")
    assert prefect_db.keep(tmp_path / "first", {})
    mine = started_database(tmp_path / "mine", flow_runs=3)
    assert not prefect_db.seed(tmp_path / "mine", {})
    assert len(rows(mine, "flow_run")) == 3
    url = {"PREFECT_API_DATABASE_CONNECTION_URL": "postgresql+asyncpg://db/prefect"}
    assert not prefect_db.seed(tmp_path / "elsewhere", url)
    assert not (tmp_path / "elsewhere" / "prefect.db").exists()


def test_no_template_or_an_unwritable_cache_only_means_migrations(tmp_path, cache):
    assert not prefect_db.seed(tmp_path / "home", {})
    assert not (tmp_path / "home" / "prefect.db").exists()
    started_database(tmp_path / "first")
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder goes")
    assert not prefect_db.keep(tmp_path / "first", {})
