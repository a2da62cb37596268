"""The PostgreSQL test server itself: it runs, is durable, and survives a SIGKILL."""

from __future__ import annotations

from pathlib import Path

from support.pgserver import PgServer, start_server


def test_session_server_is_durable(pg_server: PgServer) -> None:
    assert pg_server.sql("SHOW fsync") == [("on",)]
    assert pg_server.sql("SHOW synchronous_commit") == [("on",)]


def test_fresh_database(pg_server: PgServer) -> None:
    dsn = pg_server.new_database()
    assert dsn.rsplit("/", 1)[1].startswith("db_")
    assert pg_server.sql("SELECT current_database()", dsn.rsplit("/", 1)[1])[0][0] \
        == dsn.rsplit("/", 1)[1]


def test_committed_row_survives_kill9(tmp_path: Path) -> None:
    server = start_server(tmp_path / "pg")
    try:
        server.sql("CREATE TABLE t (v int)")
        server.sql("INSERT INTO t VALUES (42)")
        server.kill9()
        server.start()
        assert server.sql("SELECT v FROM t") == [(42,)]
    finally:
        server.stop()
