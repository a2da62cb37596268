"""The one migration runner (chatstate.durable.migrations) on SQLite and a real PostgreSQL.

The runner itself, with histories of its own: a fresh database, a partly
migrated one, one from a newer chatstate (refused, untouched), a step that
fails (nothing of the run stays), an edited history (PostgreSQL records names,
so it is caught there; SQLite counts, so there the shipped names are pinned
here instead), and openers racing on a blank database. Then the four real
histories: append-only, and a fresh store records exactly the code's list.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from chatstate.batch import _pgschema, _schema
from chatstate.batch.ledger import Ledger
from chatstate.durable.migrations import History, Migration, PgBackend, history, run
from chatstate.durable.sqlite_setup import SqliteBackend
from chatstate.errors import ChatstateError, SchemaVersionError
from chatstate.stores import open_store
from chatstate.stores.postgres import _schema as pg_store_schema
from chatstate.stores.sqlite import _schema as sqlite_store_schema

APP_ID = 0x54455354  # "TEST"
OPENERS = 6

# What shipped: a store in the field may have recorded any prefix of these, so
# each history must go on starting with them (append, never edit).
SHIPPED = {
    "sqlite store": (sqlite_store_schema.MIGRATIONS, [
        "m001_initial", "m002_search", "m003_search_lazily", "m004_blobs",
        "m005_append_at_the_floor", "m006_leases", "m007_blob_age"]),
    "postgresql store": (pg_store_schema.MIGRATIONS, [
        "m001_initial", "m002_blobs", "m003_search", "m004_leases", "m005_blob_age"]),
    "sqlite batch ledger": (_schema.MIGRATIONS, ["m001_initial"]),
    "postgresql batch ledger": (_pgschema.MIGRATIONS, ["m001_initial"]),
}


def steps(db_kind: str, *names: str) -> History[Any]:
    """A history whose steps each create a table and log that they ran."""
    def make(name: str) -> Migration[Any]:
        def step(db: Any) -> None:
            if db_kind == "pg":
                db.execute("SELECT pg_sleep(0.01)")  # widen the window for racing openers
            db.execute(f"CREATE TABLE {name}_t (x INTEGER)")
            db.execute("CREATE TABLE IF NOT EXISTS ran (name TEXT)")
            db.execute(f"INSERT INTO ran VALUES ('{name}')")
        return Migration(name, step)
    return tuple(make(n) for n in names)


ABC = ("m001_a", "m002_b", "m003_c")


# -- SQLite ---------------------------------------------------------------------------

def sqlite_backend(db: sqlite3.Connection, path: Path) -> SqliteBackend:
    return SqliteBackend.on(db, path, APP_ID, "test database", "Use another file.")


def sqlite_run(path: Path, migrations: History[Any]) -> list[str]:
    db = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
    try:
        return run(sqlite_backend(db, path), migrations)
    finally:
        db.close()


def ran(db: Any) -> list[str]:
    return [r[0] for r in db.execute("SELECT name FROM ran ORDER BY name").fetchall()]


def test_sqlite_fresh_database_gets_every_migration(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    assert sqlite_run(path, steps("sqlite", *ABC)) == list(ABC)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
        assert db.execute("PRAGMA application_id").fetchone()[0] == APP_ID
        assert ran(db) == list(ABC)


def test_sqlite_partly_migrated_gets_the_rest_only(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    assert sqlite_run(path, steps("sqlite", *ABC[:1])) == ["m001_a"]
    assert sqlite_run(path, steps("sqlite", *ABC)) == ["m002_b", "m003_c"]
    assert sqlite_run(path, steps("sqlite", *ABC)) == []
    with sqlite3.connect(path) as db:
        assert ran(db) == list(ABC)
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3


def test_sqlite_up_to_date_opens_without_a_write(tmp_path: Path) -> None:
    """Another process holds the write lock: an up-to-date database still opens at once."""
    path = tmp_path / "t.db"
    sqlite_run(path, steps("sqlite", *ABC))
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        db = sqlite3.connect(path, isolation_level=None, timeout=0)
        assert run(sqlite_backend(db, path), steps("sqlite", *ABC)) == []
        db.close()
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_sqlite_newer_than_known_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    sqlite_run(path, steps("sqlite", *ABC))
    before = path.read_bytes()
    with pytest.raises(SchemaVersionError) as info:
        sqlite_run(path, steps("sqlite", *ABC[:2]))
    said = str(info.value)
    assert str(path) in said
    assert "schema version 3 is newer than this chatstate knows (2)" in said
    assert "upgrade chatstate" in said
    assert info.value.where == str(path)
    assert path.read_bytes() == before


def test_sqlite_failing_step_leaves_nothing_of_the_run(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    sqlite_run(path, steps("sqlite", *ABC[:1]))

    def broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half_done (x INTEGER)")
        raise sqlite3.OperationalError("disk I/O error")

    with pytest.raises(sqlite3.OperationalError):
        sqlite_run(path, (*steps("sqlite", *ABC[:2]), Migration("m003_broken", broken)))
    with sqlite3.connect(path) as db:  # m002 ran, then was rolled back with m003
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
        assert ran(db) == ["m001_a"]
        assert db.execute("SELECT 1 FROM sqlite_master WHERE name IN "
                          "('m002_b_t', 'half_done')").fetchone() is None


def test_sqlite_openers_racing_on_a_blank_database_migrate_it_once(tmp_path: Path) -> None:
    for attempt in range(5):
        path = tmp_path / f"race{attempt}.db"
        results = race(partial(sqlite_run, path, steps("sqlite", *ABC)))
        assert sorted(results, key=len) == [[]] * (OPENERS - 1) + [list(ABC)]
        with sqlite3.connect(path) as db:
            assert ran(db) == list(ABC)


def race(open_one: Callable[[], list[str]]) -> list[list[str]]:
    """``open_one`` in OPENERS threads at once (each its own connection, as processes have)."""
    start = threading.Barrier(OPENERS)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def body() -> None:
        start.wait()
        try:
            results.append(open_one())
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=body) for _ in range(OPENERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return results


# -- PostgreSQL -------------------------------------------------------------------------

@pytest.fixture
def pg_schema(pg_dsn: str) -> str:
    return "t_" + secrets.token_hex(6)


@contextmanager
def pg(dsn: str) -> Iterator[Any]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def pg_run(dsn: str, schema: str, migrations: History[Any]) -> list[str]:
    with pg(dsn) as conn:
        return run(PgBackend(conn, schema, table="applied", columns="name text PRIMARY KEY, "
                             "applied_at text NOT NULL", where=f"db {schema}",
                             what="test database", begin=conn.transaction), migrations)


def pg_names(dsn: str, schema: str) -> list[str]:
    with pg(dsn) as conn:
        return [r[0] for r in conn.execute(f"SELECT name FROM {schema}.applied "
                                           "ORDER BY name").fetchall()]


def pg_ran(dsn: str, schema: str) -> list[str]:
    with pg(dsn) as conn:
        return [r[0] for r in conn.execute(f"SELECT name FROM {schema}.ran "
                                           "ORDER BY name").fetchall()]


def test_pg_fresh_and_partly_migrated(pg_dsn: str, pg_schema: str) -> None:
    assert pg_run(pg_dsn, pg_schema, steps("pg", *ABC[:1])) == ["m001_a"]
    assert pg_run(pg_dsn, pg_schema, steps("pg", *ABC)) == ["m002_b", "m003_c"]
    assert pg_run(pg_dsn, pg_schema, steps("pg", *ABC)) == []
    assert pg_names(pg_dsn, pg_schema) == pg_ran(pg_dsn, pg_schema) == list(ABC)


def test_pg_newer_than_known_is_refused_untouched(pg_dsn: str, pg_schema: str) -> None:
    pg_run(pg_dsn, pg_schema, steps("pg", *ABC))
    with pytest.raises(SchemaVersionError) as info:
        pg_run(pg_dsn, pg_schema, steps("pg", *ABC[:2]))
    said = str(info.value)
    assert f"db {pg_schema}" in said
    assert "upgrade chatstate" in said
    assert "newer chatstate (migration(s) m003_c unknown here)" in said


@pytest.mark.parametrize("applied, edited, found", [
    (ABC, ("m001_a", "m002_renamed", "m003_c"),
     "records m002_b, unknown here, and lacks m002_renamed"),
    (ABC[:2], ("m001_a", "m003_c", "m002_b"), "records m002_b but not m003_c, which comes "
                                              "before it"),
    (ABC, ("m001_a", "m004_new", "m002_b", "m003_c"), "records m002_b but not m004_new"),
    (("m001_a", "m003_c"), ABC, "records m003_c but not m002_b"),
])
def test_pg_edited_history_is_refused_untouched(pg_dsn: str, pg_schema: str,
                                                applied: tuple[str, ...],
                                                edited: tuple[str, ...], found: str) -> None:
    """Renamed, reordered, inserted before an applied one. (A removal looks like a newer
    chatstate's history to a set of names; test_histories_are_append_only catches it.)"""
    pg_run(pg_dsn, pg_schema, steps("pg", *applied))
    with pytest.raises(SchemaVersionError, match="does not fit") as info:
        pg_run(pg_dsn, pg_schema, steps("pg", *edited))
    said = str(info.value)
    assert found in said
    assert "append-only" in said
    assert f"db {pg_schema}" in said
    assert pg_names(pg_dsn, pg_schema) == pg_ran(pg_dsn, pg_schema) == sorted(applied)


def test_pg_foreign_schema_is_refused_untouched(pg_dsn: str, pg_schema: str) -> None:
    with pg(pg_dsn) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        conn.execute(f"CREATE TABLE {pg_schema}.users (name text)")
    with pytest.raises(ChatstateError, match="not chatstate's; nothing was written"):
        pg_run(pg_dsn, pg_schema, steps("pg", *ABC))
    with pg(pg_dsn) as conn:
        assert conn.execute("SELECT tablename FROM pg_tables WHERE schemaname=%s",
                            (pg_schema,)).fetchall() == [("users",)]


def test_pg_openers_racing_on_a_blank_schema_migrate_it_once(pg_dsn: str) -> None:
    for _ in range(3):
        schema = "t_" + secrets.token_hex(6)
        results = race(partial(pg_run, pg_dsn, schema, steps("pg", *ABC)))
        assert sorted(results, key=len) == [[]] * (OPENERS - 1) + [list(ABC)]
        assert pg_ran(pg_dsn, schema) == list(ABC)


# -- the four real histories --------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(SHIPPED))
def test_histories_are_append_only(kind: str) -> None:
    migrations, shipped = SHIPPED[kind]
    names = [m.name for m in migrations]
    assert len(set(names)) == len(names), f"{kind}: a migration name is used twice"
    assert names[:len(shipped)] == shipped, (
        f"{kind}: a shipped migration was renamed, reordered or removed; append instead")


def test_a_history_refuses_a_name_used_twice() -> None:
    def m001_a(db: Any) -> None:
        pass

    with pytest.raises(ChatstateError, match="names m001_a more than once"):
        history(m001_a, m001_a)


def test_fresh_sqlite_store_and_ledger_record_the_whole_history(tmp_path: Path) -> None:
    open_store(f"sqlite://{tmp_path}/s.db").close()
    Ledger.open(tmp_path / "l.db", create=True).close()
    for path, migrations in ((tmp_path / "s.db", sqlite_store_schema.MIGRATIONS),
                             (tmp_path / "l.db", _schema.MIGRATIONS)):
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == len(migrations)


def test_fresh_pg_store_and_ledger_record_the_whole_history(pg_dsn: str) -> None:
    from chatstate.batch.pgledger import PgLedger

    store_schema, ledger_schema = ("t_" + secrets.token_hex(6) for _ in range(2))
    open_store(f"{pg_dsn}?schema={store_schema}").close()
    PgLedger(f"{pg_dsn}?schema={ledger_schema}").close()
    with pg(pg_dsn) as conn:
        for table, migrations in ((f"{store_schema}.chatstate_migrations",
                                   pg_store_schema.MIGRATIONS),
                                  (f"{ledger_schema}.migrations", _pgschema.MIGRATIONS)):
            recorded = [r[0] for r in conn.execute(f"SELECT name FROM {table} "
                                                   "ORDER BY applied_at, name").fetchall()]
            assert recorded == [m.name for m in migrations]
