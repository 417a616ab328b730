"""A migrated Prefect database to start from: a new server home pays Prefect's migrations once per
machine and Prefect version, not once per server.

A Prefect server on an empty PREFECT_HOME runs its database migrations and registers its block
types before it answers (about 7 s of a 12 s start on a 2-core machine; 4 s with a database
already there). The first server day0 starts on an empty home keeps a copy of its database as
it is when it first answers (the schema and Prefect's block registrations, nothing else: the
copy is checked), under ``${XDG_CACHE_HOME:-~/.cache}/day0/prefect-db/<prefect version>.db``;
later servers on an empty home start from that copy. A database that is not SQLite under
PREFECT_HOME (a connection URL set) is never touched.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Mapping

DATABASE = "prefect.db"
# what a server's database holds when it first answers: anything else is somebody's data
STARTUP_TABLES = {"alembic_version", "block_schema", "block_schema_reference", "block_type"}
CONNECTION_SETTINGS = ("PREFECT_API_DATABASE_CONNECTION_URL",
                       "PREFECT_SERVER_DATABASE_CONNECTION_URL")


def template() -> Path:
    from importlib.metadata import version

    base = os.path.expanduser(os.environ.get("XDG_CACHE_HOME") or "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "day0" / "prefect-db" / f"{version('prefect')}.db"


def _own_sqlite(env: Mapping[str, str]) -> bool:
    return not any(env.get(name) for name in CONNECTION_SETTINGS)


def seed(home: Path, env: Mapping[str, str] = os.environ) -> bool:
    """Before a server starts on `home`: its database from the template when it has none.
    True when seeded."""
    database, source = Path(home) / DATABASE, template()
    if not _own_sqlite(env) or database.exists() or not source.is_file():
        return False
    Path(home).mkdir(parents=True, exist_ok=True)
    partial = database.with_suffix(".db.seeding")
    try:
        shutil.copyfile(source, partial)
        os.replace(partial, database)
    except OSError:  # the server migrates an empty home itself
        partial.unlink(missing_ok=True)
        return False
    return True


def keep(home: Path, env: Mapping[str, str] = os.environ) -> bool:
    """Once a server on `home` answers: its database becomes the template when there is none
    yet and it holds only what a start writes. True when kept."""
    database, target = Path(home) / DATABASE, template()
    if not _own_sqlite(env) or target.exists() or not database.is_file():
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=target.parent, suffix=".partial")
        os.close(fd)
    except OSError:
        return False
    partial = Path(name)
    try:
        # the backup API copies a live WAL database consistently
        with closing(sqlite3.connect(database, timeout=10)) as live, \
                closing(sqlite3.connect(partial)) as copy:
            live.backup(copy)
        if not _only_startup_rows(partial):
            return False
        os.replace(partial, target)
    except (OSError, sqlite3.Error):  # a template is a saving, never a failure
        return False
    finally:
        partial.unlink(missing_ok=True)
    return True


def _only_startup_rows(database: Path) -> bool:
    with closing(sqlite3.connect(database)) as db:
        tables = [name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
        if "alembic_version" not in tables:
            return False
        return all(name in STARTUP_TABLES or
                   db.execute(f'SELECT 1 FROM "{name}" LIMIT 1').fetchone() is None
                   for name in tables)


__all__ = ["template", "seed", "keep"]
