"""Damaged data fails loudly and is never written over.

JSON: a truncated file, garbage, invalid UTF-8, wrong types, a tampered message
(content edited, hash kept), a missing tail and a damaged partial sidecar each
give ``CorruptTranscriptError`` naming the file (and the seq for the chain); the
file is byte-for-byte unchanged afterwards, also after attempts to append, save
a partial, set the header and reopen the store. SQLite: a file that is not a
database and a foreign application's database are refused, bytes and mode
untouched; a tampered or missing row is named by seq. Both: a 10 MB message
round-trips; a message that cannot be encoded is refused with nothing written.
"""

from __future__ import annotations

import sqlite3
import stat
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from support.stores import local_path, new_conversation, seal_chain, sealed_as_is, snapshot

from chatstate.core.transcript import Message
from chatstate.errors import ChatstateError, ConfigurationError, CorruptTranscriptError
from chatstate.stores import open_store


def _tamper_content(raw: bytes) -> bytes:
    return raw.replace(b'"msg 1"', b'"msg 1, edited"')


def _drop_last_message(raw: bytes) -> bytes:
    """Valid JSON, a valid chain, one message short: only the header's count can tell."""
    header, *messages, closing, end = raw.split(b"\n")
    kept = [*messages[:-2], messages[-2].rstrip(b",")]
    return b"\n".join([header, *kept, closing, end])


def _reorder(raw: bytes) -> bytes:
    lines = raw.split(b"\n")
    lines[1], lines[2] = lines[2], lines[1]
    return b"\n".join(lines)


DAMAGE: dict[str, tuple[Callable[[bytes], bytes], int | None, str]] = {
    "truncated": (lambda raw: raw[: len(raw) // 2], None, "not valid JSON"),
    "truncated-tail": (lambda raw: raw[:-3], None, "not valid JSON"),
    "empty": (lambda raw: b"", None, "not valid JSON"),
    "garbage": (lambda raw: bytes(range(256)) * 4, None, "not valid UTF-8"),
    "invalid-utf8": (lambda raw: raw.replace(b"msg 1", b"msg \xff\xfe"), None,
                     "not valid UTF-8"),
    "json-array": (lambda raw: b"[1, 2, 3]", None, "expected a JSON object"),
    "title-number": (lambda raw: raw.replace(b'"title":"t"', b'"title":5'), None, "title"),
    "messages-string": (lambda raw: raw.split(b',"messages":[')[0] + b',"messages":"x"}',
                        None, "messages"),
    "content-number": (lambda raw: raw.replace(b'"msg 1"', b"11"), 1, "position 1"),
    "role-unknown": (lambda raw: raw.replace(b'"role":"assistant"', b'"role":"wizard"', 1), 1,
                     "position 1"),
    "extra-field": (lambda raw: raw.replace(b'{"seq":2,', b'{"seq":2,"evil":1,'), 2,
                    "position 2"),
    "no-schema": (lambda raw: raw.replace(b'{"schema":1,', b"{"), None, "schema"),
    "tampered": (_tamper_content, 1, "seq 1"),
    "reordered": (_reorder, 0, "seq 0"),
    "tail-dropped": (_drop_last_message, 3, "message_count"),
}


def _json_store(tmp_path: Path, n: int = 4) -> tuple[str, Path, list[Message]]:
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    msgs = new_conversation(store, "c1", n, title="t")
    store.close()
    return url, tmp_path / "store" / "c1.json", msgs


@pytest.mark.invariant(6)
@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_damaged_json_is_refused_and_left_alone(
        tmp_path: Path, damage: tuple[Callable[[bytes], bytes], int | None, str]) -> None:
    mutate, position, phrase = damage
    url, path, msgs = _json_store(tmp_path)
    damaged = mutate(path.read_bytes())
    assert damaged != path.read_bytes()
    path.write_bytes(damaged)
    store = open_store(url)
    with pytest.raises(CorruptTranscriptError) as info:
        store.load("c1")
    err = info.value
    assert str(path) in str(err)
    assert err.where == str(path)
    assert phrase in str(err)
    if position is not None:
        assert err.position == position
    attempts = {
        "append": lambda: store.append("c1", seal_chain(1, msgs[-1])),
        "save_partial": lambda: store.save_partial("c1", Message.seal(
            msgs[-1], role="user", content="p", turn_id="t", status="partial")),
        "set_header": lambda: store.set_header("c1", title="overwritten?"),
    }
    for name, attempt in attempts.items():
        with pytest.raises(CorruptTranscriptError):
            attempt()
        assert path.read_bytes() == damaged, f"{name} wrote over a damaged transcript"
    store.list_conversations()  # listing a store with a damaged file still works
    store.close()
    open_store(url).close()  # and reopening (recovery) leaves it alone too
    assert path.read_bytes() == damaged
    assert not (path.parent / ".partials" / "c1.json").exists()


@pytest.mark.invariant(6)
def test_a_json_file_holding_another_conversations_id_is_named_not_served(
        tmp_path: Path) -> None:
    # a file copied (or renamed) by hand: it was listed as a second 'a1' and load('copy')
    # answered conversation 'a1', so a write through 'copy' went into a1's copy
    url = f"json://{tmp_path}/s"
    store = open_store(url)
    msgs = new_conversation(store, "a1", 2)
    store.close()
    copy = tmp_path / "s" / "copy.json"
    copy.write_bytes((tmp_path / "s" / "a1.json").read_bytes())
    before = copy.read_bytes()
    reader = open_store(url)
    listed = sorted((c.id, c.title) for c in reader.list_conversations())
    assert [cid for cid, _ in listed] == ["a1", "copy"]
    assert "unreadable" in dict(listed)["copy"]
    with pytest.raises(CorruptTranscriptError) as info:
        reader.load("copy")
    assert str(copy) in str(info.value) and "holds conversation 'a1'" in str(info.value)
    assert reader.load("a1").messages == msgs
    assert copy.read_bytes() == before


@pytest.mark.invariant(6)
def test_damaged_json_with_a_partial_is_left_alone_by_recovery(tmp_path: Path) -> None:
    url, path, msgs = _json_store(tmp_path)
    store = open_store(url)
    store.save_partial("c1", Message.seal(msgs[-1], role="user", content="half",
                                          turn_id="t", status="partial"))
    store.close()
    path.write_bytes(_tamper_content(path.read_bytes()))
    before = snapshot(tmp_path / "store")
    store = open_store(url)
    assert any("could not reconcile" in line and str(path) in line for line in store.recovery)
    store.close()
    after = snapshot(tmp_path / "store")
    assert {k: v for k, v in after.items() if k != ".chatstate/opens.jsonl"} == \
        {k: v for k, v in before.items() if k != ".chatstate/opens.jsonl"}


@pytest.mark.invariant(6)
def test_damaged_partial_sidecar_is_named_and_kept(tmp_path: Path) -> None:
    url, _path, msgs = _json_store(tmp_path)
    store = open_store(url)
    store.save_partial("c1", Message.seal(msgs[-1], role="user", content="half",
                                          turn_id="t", status="partial"))
    sidecar = tmp_path / "store" / ".partials" / "c1.json"
    sidecar.write_bytes(sidecar.read_bytes()[:-5])
    damaged = sidecar.read_bytes()
    with pytest.raises(CorruptTranscriptError) as info:
        store.load("c1")
    assert str(sidecar) in str(info.value)
    store.close()
    open_store(url).close()
    assert sidecar.read_bytes() == damaged


# -- sqlite -----------------------------------------------------------------------------------


@pytest.mark.invariant(6)
def test_not_a_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    db.write_bytes(b"this is somebody's notes file, not a database\n" * 200)
    db.chmod(0o644)
    before = db.read_bytes()
    with pytest.raises(CorruptTranscriptError) as info:
        open_store(f"sqlite://{db}")
    assert str(db) in str(info.value)
    assert "not a usable SQLite database" in str(info.value)
    assert db.read_bytes() == before
    assert stat.S_IMODE(db.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


@pytest.mark.parametrize("case", ["sqlite-at-a-directory", "json-at-a-file",
                                  "json-under-a-file"])
def test_a_store_path_of_the_wrong_kind_is_named_not_blamed_on_the_disk(
        tmp_path: Path, case: str) -> None:
    # sqlite said "disk I/O error ...: check the disk (dmesg)", json "File exists (EEXIST);
    # check the disk and retry", naming the store path, not the file in the way
    (tmp_path / "adir.db").mkdir()
    (tmp_path / "afile").write_text("notes")
    url, named, fix = {
        "sqlite-at-a-directory": (f"sqlite://{tmp_path}/adir.db", tmp_path / "adir.db",
                                  "is a directory, and a sqlite store is a file"),
        "json-at-a-file": (f"json://{tmp_path}/afile", tmp_path / "afile",
                           "is a file, not a directory"),
        "json-under-a-file": (f"json://{tmp_path}/afile/sub", tmp_path / "afile",
                              "is a file, not a directory")}[case]
    with pytest.raises(ConfigurationError) as info:
        open_store(url)
    assert f"{named} {fix}" in str(info.value)
    assert "check the disk" not in str(info.value)
    assert (tmp_path / "afile").read_text() == "notes"
    assert list((tmp_path / "adir.db").iterdir()) == []


@pytest.mark.invariant(6)
@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_foreign_sqlite_database_is_refused_untouched(tmp_path: Path, journal: str) -> None:
    db = tmp_path / "s.db"
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA journal_mode={journal}")
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO users (name) VALUES ('ada')")
    con.commit()
    con.close()
    db.chmod(0o644)
    before = db.read_bytes()
    with pytest.raises(CorruptTranscriptError) as info:
        open_store(f"sqlite://{db}")
    assert str(db) in str(info.value)
    assert "not a chatstate store" in str(info.value)
    assert db.read_bytes() == before
    assert stat.S_IMODE(db.stat().st_mode) == 0o644
    con = sqlite3.connect(db)
    assert con.execute("SELECT name FROM sqlite_master").fetchall() == [("users",)]
    con.close()


def _sqlite_store(tmp_path: Path) -> tuple[str, Path, list[Message]]:
    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    msgs = new_conversation(store, "c1", 4)
    store.close()
    return url, tmp_path / "s.db", msgs


def _rows(db: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT * FROM messages ORDER BY conversation_id, seq").fetchall()
    finally:
        con.close()


SQL_DAMAGE = {
    "tampered": ("UPDATE messages SET body=replace(body, 'msg 2', 'msg 2, edited') "
                 "WHERE seq=2", 2),
    "removed-middle": ("DELETE FROM messages WHERE seq=1", 1),
    "removed-last": ("DELETE FROM messages WHERE seq=3", 3),
    "bad-json": ("UPDATE messages SET body='{not json' WHERE seq=0", 0),
}


@pytest.mark.invariant(6)
@pytest.mark.parametrize("damage", SQL_DAMAGE.values(), ids=SQL_DAMAGE.keys())
def test_damaged_sqlite_rows_are_named_by_seq(tmp_path: Path,
                                              damage: tuple[str, int]) -> None:
    sql, position = damage
    url, db, msgs = _sqlite_store(tmp_path)
    con = sqlite3.connect(db)
    con.execute(sql)
    con.commit()
    con.close()
    rows = _rows(db)
    store = open_store(url)
    with pytest.raises(CorruptTranscriptError) as info:
        store.load("c1")
    assert str(db) in str(info.value)
    assert "'c1'" in str(info.value)
    assert info.value.position == position
    # O(1) writes do not re-verify the whole chain (load does, and a session loads
    # first); whatever they do, the damaged rows themselves are never rewritten
    for attempt in (lambda: store.append("c1", seal_chain(1, msgs[-1])),
                    lambda: store.save_partial("c1", Message.seal(
                        msgs[-1], role="user", content="p", turn_id="t", status="partial")),
                    lambda: store.set_header("c1", title="x")):
        with suppress(ChatstateError):
            attempt()
    store.close()
    assert _rows(db)[: len(rows)] == rows


# -- sizes and encodings ----------------------------------------------------------------------


def test_ten_megabyte_message_round_trips(store: Any) -> None:
    msgs = new_conversation(store, "big", 1)
    text = ("0123456789abcdef\u00e9\u4e2d\U0001f600\n" * 500_000)[: 10 * 1024 * 1024]
    big = Message.seal(msgs[-1], role="assistant", content=text, turn_id="t")
    store.append("big", [big])
    conv = store.load("big")
    assert conv.messages[-1].content == text
    assert conv.verify() is None
    store.append("big", seal_chain(1, big))
    assert len(store.load("big").messages) == 3


def test_unencodable_text_is_refused_and_nothing_written(local_store_url: str) -> None:
    store = open_store(local_store_url)
    msgs = new_conversation(store, "c1", 2)
    before = snapshot(local_path(local_store_url))
    lone = sealed_as_is(msgs[-1], role="user", content="half a pair: \ud800", turn_id="t")
    with pytest.raises(ValueError):
        store.append("c1", [lone])
    assert store.load("c1").messages == msgs
    if local_store_url.startswith("json"):  # (before close: closing compacts the json log)
        assert snapshot(local_path(local_store_url)) == before
    store.close()


@pytest.mark.parametrize("size", [20, 2_000_000])
def test_unencodable_partial_is_refused_and_nothing_written(local_store_url: str,
                                                              size: int) -> None:
    # the json store writes a record in pieces: a piece that cannot be encoded, after
    # others were written, must still leave the files as they were
    store = open_store(local_store_url)
    msgs = new_conversation(store, "c1", 2)
    store.save_partial("c1", Message.seal(msgs[-1], role="assistant", content="kept",
                                          turn_id="t", status="partial"))
    before = snapshot(local_path(local_store_url))
    lone = sealed_as_is(msgs[-1], role="assistant", content="x" * size + "\ud800",
                        turn_id="t", status="partial")
    with pytest.raises(ValueError):
        store.save_partial("c1", lone)
    conv = store.load("c1")
    assert conv.messages == msgs
    assert conv.partial is not None and conv.partial.content == "kept"
    if local_store_url.startswith("json"):
        assert snapshot(local_path(local_store_url)) == before
    store.close()
