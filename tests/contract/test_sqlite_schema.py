"""The sqlite store's named migrations, from a blank database and from an older one,
and the full-text index that search() brings up to date lazily."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store
from chatstate.stores.sqlite._schema import APPLICATION_ID, MIGRATIONS


def seal_turns(prev: Message | None, *texts: str) -> list[Message]:
    out: list[Message] = []
    for text in texts:
        prev = Message.seal(prev, role="user", content=text, turn_id=f"t{len(out)}")
        out.append(prev)
    return out


def test_blank_database_gets_every_migration(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    open_store(f"sqlite://{db}").close()
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert con.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


def test_search_indexes_what_was_appended_since_the_last_search(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/s.db")
    store.create(Conversation(id="c"))
    first = seal_turns(None, "the quick brown fox", "lazy dogs sleep")
    store.append("c", first)
    assert [(c, s) for c, s, _ in store.search("fox")] == [("c", 0)]
    store.append("c", seal_turns(first[-1], "another fox appears"))
    assert sorted(s for _, s, _ in store.search("FOX")) == [0, 2]
    assert len(store.search("fox")) == 2  # indexing twice adds nothing twice
    store.delete("c")
    assert store.search("fox") == []


def test_a_version_2_database_upgrades_and_keeps_its_index(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    con = sqlite3.connect(db, isolation_level=None)
    for migration in MIGRATIONS[:2]:
        migration.step(con)
    con.execute("PRAGMA user_version=2")
    con.execute(f"PRAGMA application_id={APPLICATION_ID}")
    msgs = seal_turns(None, "an old fox", "an old hen")
    con.execute("INSERT INTO conversations (id, created_at, updated_at, message_count, "
                "last_hash) VALUES ('old', 'x', 'x', 2, ?)", (msgs[-1].hash,))
    for m in msgs:
        con.execute("INSERT INTO messages VALUES ('old', ?, ?, ?)", (m.seq, m.body(), m.hash))
        con.execute("INSERT INTO message_text VALUES (?, 'old', ?)", (m.content, m.seq))
    con.close()
    store = open_store(f"sqlite://{db}")
    assert [m.content for m in store.load("old").messages] == ["an old fox", "an old hen"]
    assert [s for _, s, _ in store.search("old")] == [0, 1]  # backfilled, not indexed twice
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_network_filesystem_falls_back_to_a_rollback_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """WAL needs shared memory that nfs/cifs/sshfs do not give: the store says so and
    uses a rollback journal with synchronous=EXTRA. (The mount table is faked: this
    machine has no network filesystem to put a database on.)"""
    from chatstate.durable import guard as durability

    real = durability.inspect

    def on_nfs(path: object, **kw: object) -> durability.Report:
        report = real(path, **kw)  # type: ignore[arg-type]
        report.fstype, report.network_fs = "nfs4", True
        return report

    monkeypatch.setattr(durability, "inspect", on_nfs)
    store = open_store(f"sqlite://{tmp_path}/n.db")
    assert any("network filesystem" in note for note in store.recovery)
    with sqlite3.connect(tmp_path / "n.db") as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 3  # EXTRA
    store.create(Conversation(id="c"))
    store.append("c", seal_turns(None, "still works"))
    assert [m.content for m in store.load("c").messages] == ["still works"]


def test_a_version_3_database_upgrades_to_appends_that_dirty_fewer_pages(
        tmp_path: Path) -> None:
    """m005 drops the index that every append's updated_at used to dirty; what is
    stored loads and verifies, new appends work, and listing still sorts by recency."""
    db = tmp_path / "v3.db"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    for migration in MIGRATIONS[:3]:
        migration.step(con)
    con.execute("PRAGMA user_version=3")
    con.execute(f"PRAGMA application_id={APPLICATION_ID}")
    msgs = seal_turns(None, "from version 3", "still here")
    for cid, stamp in (("old", "2026-01-01T00:00:00Z"), ("older", "2025-01-01T00:00:00Z")):
        con.execute("INSERT INTO conversations (id, created_at, updated_at, message_count, "
                    "last_hash) VALUES (?, ?, ?, 2, ?)", (cid, stamp, stamp, msgs[-1].hash))
        for m in msgs:
            con.execute("INSERT INTO messages VALUES (?, ?, ?, ?)", (cid, m.seq, m.body(), m.hash))
    assert con.execute("SELECT 1 FROM sqlite_master WHERE name='conversations_updated'").fetchone()
    con.close()

    store = open_store(f"sqlite://{db}")
    assert [m.content for m in store.load("old").messages] == ["from version 3", "still here"]
    with sqlite3.connect(db) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert check.execute("SELECT 1 FROM sqlite_master "
                             "WHERE name='conversations_updated'").fetchone() is None
    store.append("older", seal_turns(msgs[-1], "a new turn"))
    assert [s.id for s in store.list_conversations()] == ["older", "old"]
    assert [m.content for m in store.load("older").messages][-1] == "a new turn"
    store.close()


def test_a_new_database_has_small_pages_and_an_old_one_keeps_its_own(tmp_path: Path) -> None:
    from chatstate.stores.sqlite._schema import PAGE_SIZE

    open_store(f"sqlite://{tmp_path}/new.db").close()
    old = tmp_path / "old.db"
    con = sqlite3.connect(old, isolation_level=None)
    con.execute("PRAGMA page_size=4096")
    con.execute("PRAGMA journal_mode=WAL")
    for migration in MIGRATIONS[:3]:
        migration.step(con)
    con.execute("PRAGMA user_version=3")
    con.execute(f"PRAGMA application_id={APPLICATION_ID}")
    con.close()
    open_store(f"sqlite://{old}").close()
    for path, size in ((tmp_path / "new.db", PAGE_SIZE), (old, 4096)):
        with sqlite3.connect(path) as check:
            assert check.execute("PRAGMA page_size").fetchone()[0] == size


def test_replacing_a_long_partial_reply_writes_its_new_pages_only(tmp_path: Path) -> None:
    """A partial save replaces the one before it; the old one's freed pages are not
    written over with zeros first (Debian's SQLite does that by default: a long reply's
    saves wrote about twice its size). Counted in WAL bytes: the WAL is emptied before
    the second save, so what it holds after is what that save wrote."""
    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    store.create(Conversation(id="c"))
    (user,) = seal_turns(None, "go")
    store.append("c", [user])
    size = 1_000_000
    for n in (size, size + 1):
        partial = Message.seal(user, role="assistant", status="partial", turn_id="t",
                               content="y" * n)
        if n > size:
            with sqlite3.connect(tmp_path / "s.db") as other:  # the first save's frames
                assert other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
            assert (tmp_path / "s.db-wal").stat().st_size == 0
        store.save_partial("c", partial)
    written = (tmp_path / "s.db-wal").stat().st_size
    assert size < written < 1.3 * size, written  # zero-filled first, it was over 2x
    assert store.load("c").partial == partial
    store.close()
