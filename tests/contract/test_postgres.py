"""The postgresql:// store against a real server (tests/support/pgserver.py): what only it has.

The shared suites (contract, crash, blobs, leases) run over it through
``store_url``; here: the server's durability guard, credentials that never
show, bad URLs, damaged rows, a foreign or newer schema, full-text search,
migrate to and from it, and a SIGKILL of the server itself.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest
from support.pgserver import PgServer, fresh_schema_url, start_server
from support.stores import new_conversation, parse_acks, pg_connect, seal_chain, spawn_writer

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    ChatstateError,
    CorruptTranscriptError,
    EphemeralStoreError,
    SchemaVersionError,
    StoreUnavailable,
)
from chatstate.ops import doctor
from chatstate.ops.migrate import migrate
from chatstate.stores import open_store


def _db_with(pg_server: PgServer, setting: str) -> str:
    """A fresh database whose sessions run with ``setting`` (e.g. synchronous_commit=off)."""
    dsn = pg_server.new_database()
    name, value = setting.split("=")
    pg_server.sql(f"ALTER DATABASE {dsn.rsplit('/', 1)[1]} SET {name} = {value}")
    return fresh_schema_url(dsn)


# -- the durability guard ------------------------------------------------------------------

def test_guard_reports_the_server_settings(pg_url: str) -> None:
    store = open_store(pg_url)
    report = store.guard_report
    assert report.verdict == "durable"
    assert report.fstype == "postgresql"
    assert "fsync=on, synchronous_commit=on, full_page_writes=on" in report.reasons[0]
    store.close()


@pytest.mark.invariant(3)
@pytest.mark.parametrize("setting", ["synchronous_commit=off", "fsync=off"])
def test_server_that_acks_before_flushing_is_refused(pg_server: PgServer, setting: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHATSTATE_ALLOW_EPHEMERAL", raising=False)
    if setting == "fsync=off":  # a server-wide setting: a server of its own
        server = start_server(Path(pg_server.root.parent) / f"nofsync-{secrets.token_hex(3)}")
        server.sql("ALTER SYSTEM SET fsync = off")
        server.sql("SELECT pg_reload_conf()")
        url = fresh_schema_url(server.dsn())
    else:
        server, url = None, _db_with(pg_server, setting)
    try:
        with pytest.raises(EphemeralStoreError) as info:
            open_store(url)
        assert setting in str(info.value)
        assert "--allow-ephemeral" in str(info.value)
        with pg_connect(url) as conn:  # refused before anything was written
            schema = url.rsplit("schema=", 1)[1]
            assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname=%s",
                                (schema,)).fetchone() is None
        store = open_store(url, allow_ephemeral=True)
        assert store.guard_report.verdict == "ephemeral"
        report = doctor.diagnose(store)
        assert any("ephemeral" in w for w in report.warnings)
        assert setting in json.dumps(report.durability)
        store.close()
    finally:
        if server is not None:
            server.stop()


def test_read_only_server_is_a_clear_error(pg_server: PgServer) -> None:
    url = _db_with(pg_server, "default_transaction_read_only=on")
    with pytest.raises(StoreUnavailable, match=r"read-only.*writable primary"):
        open_store(url, allow_ephemeral=True)
    report = doctor.run(url)
    assert not report.ready
    assert "read-only" in report.problems[0]


# -- credentials ---------------------------------------------------------------------------

@pytest.mark.invariant(9)
def test_the_password_never_shows(pg_server: PgServer, pg_url: str) -> None:
    password = pg_server.password
    store = open_store(pg_url)
    new_conversation(store, "c1", 2)
    report = doctor.diagnose(store)
    shown = json.dumps(report.to_dict()) + store.url + repr(store.location())
    assert password not in shown
    assert store.url == pg_url.replace(f":{password}@", "@")
    assert password not in json.dumps(store.opens())
    store.close()
    with pg_connect(pg_url) as conn:  # nothing stored holds it either
        for table in ("conversations", "messages", "opens", "chatstate_migrations"):
            assert password not in repr(conn.execute(f"SELECT * FROM {table}").fetchall())
    wrong = pg_url.replace(password, "not-" + password)
    with pytest.raises(StoreUnavailable) as info:
        open_store(wrong)
    assert "password authentication failed" in str(info.value)
    assert password not in str(info.value)


def test_password_from_the_libpq_environment(pg_server: PgServer,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPASSWORD", pg_server.password)
    url = fresh_schema_url(pg_server.dsn().replace(f":{pg_server.password}@", "@"))
    store = open_store(url)
    new_conversation(store, "c1", 1)
    assert store.load("c1").messages[0].content == "msg 0"
    store.close()


def test_password_from_pgpass(pg_server: PgServer, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{pg_server.port}:*:chatstate:{pg_server.password}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    monkeypatch.delenv("PGPASSWORD", raising=False)
    url = fresh_schema_url(pg_server.dsn().replace(f":{pg_server.password}@", "@"))
    open_store(url).close()


@pytest.mark.invariant(9)
@pytest.mark.parametrize("url, problem", [
    ("postgresql://u@h/db?schema=Bad-Name", "schema 'Bad-Name' must be"),
    ("postgresql://u@h/db?schema=x&colour=red", "unknown parameter(s) colour"),
    ("postgresql://u:pw123456@h:notaport/db", "malformed"),
])
def test_bad_urls_are_clear_and_redacted(url: str, problem: str) -> None:
    with pytest.raises(ChatstateError) as info:
        open_store(url)
    assert problem in str(info.value)
    assert "Example: postgresql://" in str(info.value)
    assert "pw123456" not in str(info.value)


def test_unreachable_server_is_store_unavailable(tmp_path: Path) -> None:
    from support.pgserver import free_port

    url = f"postgresql://chatstate:pw-123456@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(StoreUnavailable) as info:
        open_store(url)
    assert "127.0.0.1" in str(info.value)
    assert "pw-123456" not in str(info.value)


# -- damage and schemas ------------------------------------------------------------------

PG_DAMAGE = {
    "tampered": ("UPDATE messages SET body=replace(body, 'msg 2', 'msg 2, edited') "
                 "WHERE seq=2", 2),
    "removed-middle": ("DELETE FROM messages WHERE seq=1", 1),
    "removed-last": ("DELETE FROM messages WHERE seq=3", 3),
    "bad-json": ("UPDATE messages SET body='{not json' WHERE seq=0", 0),
}


@pytest.mark.invariant(6)
@pytest.mark.parametrize("damage", PG_DAMAGE.values(), ids=PG_DAMAGE.keys())
def test_damaged_rows_are_named_by_seq_and_never_rewritten(pg_url: str,
                                                           damage: tuple[str, int]) -> None:
    sql, position = damage
    store = open_store(pg_url)
    msgs = new_conversation(store, "c1", 4)
    store.close()
    with pg_connect(pg_url) as conn:
        conn.execute(sql)  # type: ignore[arg-type]
        rows = conn.execute("SELECT * FROM messages ORDER BY seq").fetchall()
    store = open_store(pg_url)
    with pytest.raises(CorruptTranscriptError) as info:
        store.load("c1")
    assert "conversation 'c1'" in str(info.value)
    assert info.value.position == position
    for attempt in (lambda: store.append("c1", seal_chain(1, msgs[-1])),
                    lambda: store.set_header("c1", title="x")):
        with pytest.raises(ChatstateError):
            attempt()
    store.close()
    with pg_connect(pg_url) as conn:
        assert conn.execute("SELECT * FROM messages ORDER BY seq").fetchall() == rows


@pytest.mark.invariant(6)
def test_foreign_schema_is_refused_untouched(pg_url: str) -> None:
    schema = pg_url.rsplit("schema=", 1)[1]
    with pg_connect(pg_url) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
        conn.execute(f"CREATE TABLE {schema}.users (name text)")  # type: ignore[arg-type]
    with pytest.raises(ChatstateError, match="not chatstate's; nothing was written"):
        open_store(pg_url)
    with pg_connect(pg_url) as conn:
        assert conn.execute("SELECT tablename FROM pg_tables WHERE schemaname=%s",
                            (schema,)).fetchall() == [("users",)]


def test_schema_from_a_newer_chatstate_is_refused(pg_url: str) -> None:
    open_store(pg_url).close()
    with pg_connect(pg_url) as conn:
        conn.execute("INSERT INTO chatstate_migrations (name) VALUES ('m999_future')")
    with pytest.raises(SchemaVersionError, match=r"m999_future.*upgrade chatstate"):
        open_store(pg_url)


def test_migrations_are_named_and_applied_once(pg_url: str) -> None:
    from chatstate.stores.postgres._schema import MIGRATIONS

    open_store(pg_url).close()
    open_store(pg_url).close()
    with pg_connect(pg_url) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT name FROM chatstate_migrations ORDER BY name").fetchall()]
    assert names == sorted(m.name for m in MIGRATIONS)


def test_check_leaves_no_probe_row(pg_url: str) -> None:
    store = open_store(pg_url)
    report = store.check()
    assert report.ok
    assert len(report.steps) == 3
    with pg_connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM probes").fetchone()[0] == 0
    store.close()


def test_full_text_search(pg_url: str) -> None:
    store = open_store(pg_url)
    store.create(Conversation(id="s1"))
    store.create(Conversation(id="s2"))
    a = Message.seal(None, role="user", content="the quick brown fox", turn_id="t1")
    store.append("s1", [a, Message.seal(a, role="assistant", content="Brown foxes run",
                                        turn_id="t1")])
    store.append("s2", [Message.seal(None, role="user", content="a lazy dog", turn_id="t2")])
    assert store.search("Brown FOX") == [("s1", 0, "the quick brown fox")]
    assert [hit[:2] for hit in store.search("brown")] == [("s1", 0), ("s1", 1)]
    assert store.search("dog", limit=1) == [("s2", 0, "a lazy dog")]
    assert store.search("zebra") == []
    store.close()


@pytest.mark.invariant(6)
def test_quarantine_keeps_the_rows(pg_url: str) -> None:
    store = open_store(pg_url)
    new_conversation(store, "c1", 3)
    where = store.quarantine("c1")
    assert "quarantine" in where
    assert [s.id for s in store.list_conversations()] == []
    with pg_connect(pg_url) as conn:
        dump = json.loads(conn.execute("SELECT dump FROM quarantine").fetchone()[0])
    assert [m[0] for m in dump["messages"]] == [0, 1, 2]
    store.close()


# -- migrate -------------------------------------------------------------------------------

def test_migrate_sqlite_to_postgresql_to_json(tmp_path: Path, pg_url: str) -> None:
    from support.migrate_corpus import CORPUS, TOTAL, build_corpus, state

    src = open_store(f"sqlite://{tmp_path}/a.db")
    build_corpus(src)
    pg = open_store(pg_url)
    back = open_store(f"json://{tmp_path}/b")
    expected = state(src)
    for a, b in ((src, pg), (pg, back)):
        report = migrate(a, b)
        assert report.ok
        assert sorted(report.copied) == sorted(CORPUS)
        assert report.messages_copied == TOTAL + 2
        assert report.partials_copied == 2
        assert state(b) == expected
    again = migrate(src, pg)
    assert again.ok
    assert again.copied == []
    assert again.messages_copied == 0


# -- the server itself killed -----------------------------------------------------------------

@pytest.mark.invariant(3)
def test_acknowledged_turns_survive_a_sigkill_of_the_server(tmp_path: Path) -> None:
    """A writer appends and acknowledges; the postmaster is SIGKILLed mid-run; after its
    restart every acknowledged message is there, exactly once, and appends go on."""
    server = start_server(tmp_path / "pg")
    try:
        url = fresh_schema_url(server.dsn())
        store = open_store(url)
        store.create(Conversation(id="c1"))
        store.close()
        writer = spawn_writer("serve", url, "c1")
        assert writer.stdout is not None
        assert writer.stdin is not None
        assert writer.stdout.readline().strip() == "ready"
        writer.stdin.write("go\n")
        writer.stdin.flush()
        acks: list[str] = []
        while len(acks) < 20:  # the writer is mid-run: it has acknowledged turns
            line = writer.stdout.readline()
            assert line, writer.stderr.read() if writer.stderr else ""
            if line.startswith("ack"):
                acks.append(line)
        server.kill9()
        writer.stdin.close()
        out = "".join(acks) + writer.stdout.read()  # the writer fails at its next write
        writer.wait(60)
        server.start()
        store = open_store(url)
        conv = store.load("c1")
        acked = parse_acks(out)
        assert len(acked) >= 20
        hashes = [m.hash for m in conv.messages]
        for seq, h in acked:
            assert seq < len(hashes)
            assert hashes[seq] == h
        store.append("c1", seal_chain(1, conv.messages[-1]))
        store.close()
    finally:
        server.stop()


def test_text_with_a_nul_character_round_trips(pg_url: str) -> None:
    store = open_store(pg_url)
    store.create(Conversation(id="c1"))
    msg = Message.seal(None, role="user", content="before\x00after", turn_id="t1")
    store.append("c1", [msg])
    assert store.load("c1").messages == [msg]
    assert store.search("after") == [("c1", 0, "before after")]
    store.close()


@pytest.mark.invariant(2, 4, 7)
def test_drill_on_postgresql(pg_url: str) -> None:
    """`chatstate drill`: writers SIGKILLed in every phase lose nothing acknowledged (their
    leases are taken over at once: their pids are gone)."""
    from support.drill_runs import assert_clean, drill

    code, doc, err = drill(pg_url, "--trials", "12", "--seed", "3")
    assert code == 0, f"exit {code}: {doc}\n{err}"
    assert_clean(doc, 12)
    assert pg_server_password_absent(pg_url, json.dumps(doc) + err)


def pg_server_password_absent(url: str, text: str) -> bool:
    password = url.split("@", 1)[0].rsplit(":", 1)[1]
    return password not in text


# -- a writer frozen inside its transaction (issue 21 item 11) -----------------------------

def test_a_held_row_lock_gives_in_use_not_a_hang(pg_dsn: str) -> None:
    import threading

    from chatstate.errors import ConversationInUse

    url = fresh_schema_url(pg_dsn, lock_timeout="1")
    store = open_store(url)
    nxt = seal_chain(1, new_conversation(store, "c1", 1)[-1])[0]
    outcome: list[BaseException | None] = []

    def append() -> None:
        try:
            store.append("c1", [nxt])
            outcome.append(None)
        except BaseException as exc:  # reported below
            outcome.append(exc)

    frozen = pg_connect(url)
    try:
        frozen.execute("BEGIN")
        frozen.execute("SELECT 1 FROM conversations WHERE id='c1' FOR UPDATE")
        worker = threading.Thread(target=append, daemon=True)
        worker.start()
        worker.join(20)
        assert outcome, "the append hung behind a row lock"
        assert isinstance(outcome[0], ConversationInUse), outcome[0]
        assert "in use" in str(outcome[0])
    finally:
        frozen.close()
        if not outcome:
            worker.join(30)
    store.append("c1", [nxt])  # the lock gone, the same append goes through
    assert len(store.load("c1").messages) == 2
    store.close()


def test_bad_lock_timeout_is_named(pg_dsn: str) -> None:
    with pytest.raises(ChatstateError, match="lock_timeout"):
        open_store(fresh_schema_url(pg_dsn, lock_timeout="soon"))


# -- the pool after a server restart (issue 21 item 9) -------------------------------------

def test_calls_after_a_server_restart_succeed(tmp_path: Path) -> None:
    server = start_server(tmp_path / "pg")
    try:
        store = open_store(fresh_schema_url(server.dsn(), pool_size="3"))
        msgs = new_conversation(store, "c1", 1)
        msgs += seal_chain(1, msgs[-1])
        server.kill9()
        server.start()
        for _ in range(4):  # more calls than pooled connections: each one was dead
            assert len(store.load("c1").messages) == 1
        store.append("c1", [msgs[1]])
        assert len(store.load("c1").messages) == 2
        store.close()
    finally:
        server.stop()


# -- the guard again while the store is open (issue 21 item 3) -----------------------------

@pytest.mark.parametrize("how", ["reload", "restart"])
def test_server_turned_unsafe_after_open_is_refused(tmp_path: Path, how: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHATSTATE_ALLOW_EPHEMERAL", raising=False)
    server = start_server(tmp_path / "pg")
    try:
        store = open_store(fresh_schema_url(server.dsn(), guard_interval="0.2"))
        msgs = new_conversation(store, "c1", 1)
        if how == "reload":  # a running server, no new connection: the interval check
            server.sql("ALTER SYSTEM SET synchronous_commit = off")
            server.sql("SELECT pg_reload_conf()")
            time.sleep(0.5)
        else:  # a restart: the reconnected sessions are checked
            server.sql("ALTER SYSTEM SET fsync = off")
            server.stop()
            server.start()
        nxt = seal_chain(1, msgs[-1])
        for _ in range(2):  # refused, and refused again: nothing acknowledged afterwards
            with pytest.raises(EphemeralStoreError, match=r"fsync=off|synchronous_commit=off"):
                store.append("c1", nxt)
        assert len(store.load("c1").messages) == 1
        store.close()
    finally:
        server.stop()
