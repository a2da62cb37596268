"""The bad-input corpus, through the ``chatstate`` command.

Every damaged transcript (truncated, invalid UTF-8, wrong types, a schema from
the future, tampered, empty, garbage; for SQLite also a file that is not a
database, another application's database, a tampered or undecodable row) is
met by ``replay``, ``replay --verify``, ``ask``, ``export`` and ``rm`` with exit
1 and exactly one ``error:`` paragraph that names the file (and the seq, where
there is one), never a traceback; ``list`` keeps working; and the damaged file
is byte-for-byte what it was (for SQLite: the damaged rows, since every open
records itself in the database). Hostile ids (``/``, ``..``, NUL, 300
characters) are refused before anything is written; a 10 MB message round
trips; an import file that is not a transcript imports nothing and is left as
it was.

Most runs are in-process (``invoke``, the console script's own code path); the
``real process`` test repeats the worst cases through the installed script.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli_helpers import Result, cli_env, invoke, run_cli
from support.stores import local_path, new_conversation, seal_chain, snapshot

from chatstate.core.transcript import Conversation, Message, validate_id
from chatstate.errors import InvalidConversationId
from chatstate.stores import open_store

CID = "damaged"
COMMANDS = {
    "replay": ["replay", CID],
    "verify": ["replay", CID, "--verify"],
    "ask": ["ask", "--model", "fake", "--id", CID, "hello again"],
    "export": ["export", CID, "-o", "-"],
    "rm": ["rm", CID, "--yes"],
}


def error_paragraph(result: Result, code: int = 1) -> str:
    """Exit ``code``, no traceback, exactly one ``error:`` line; the text from it to the end."""
    assert result.code == code, (result.code, result.err)
    assert "Traceback" not in result.err, result.err
    assert "unexpected" not in result.err, result.err
    lines = result.err.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(starts) == 1, result.err
    return "\n".join(lines[starts[0]:])


def assert_one_error(result: Result, *names: str, code: int = 1) -> str:
    """One ``error:`` paragraph, on one line, that contains every name.

    """
    error = error_paragraph(result, code)
    assert "errors.pydantic.dev" not in error, error
    assert "\n" not in error, f"the error runs over several lines:\n{error}"
    for name in names:
        assert name in error, f"{name!r} not in: {error}"
    return error


def assert_usage_or_error(result: Result, *names: str) -> None:
    """Exit 2 (usage, click's own message) or 1 (one error paragraph), no traceback."""
    assert result.code in (1, 2), (result.code, result.err)
    assert "Traceback" not in result.err, result.err
    assert "unexpected" not in result.err, result.err
    text = " ".join(result.err.split())
    for name in names:
        assert name in text, f"{name!r} not in: {result.err}"


# -- damaged JSON transcripts --------------------------------------------------------------

def _replace(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    def damage(raw: bytes) -> bytes:
        assert old in raw, old
        return raw.replace(old, new, 1)
    return damage


JSON_DAMAGE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    # name: (damage, a word the error must contain)
    "truncated": (lambda raw: raw[:len(raw) // 2], "JSON"),
    "invalid-utf8": (_replace(b"msg 1", b"msg \xff\xfe"), "UTF-8"),
    "wrong-type-seq": (_replace(b'"seq":1,', b'"seq":"one",'), "position 1"),
    "wrong-type-title": (_replace(b'"title":"t"', b'"title":42'), "title"),
    "future-schema": (_replace(b'{"schema":1,', b'{"schema":99,'), "schema 99"),
    "tampered": (_replace(b'"msg 2"', b'"msg 2, edited"'), "seq 2"),
    "empty": (lambda raw: b"", "JSON"),
    "garbage": (lambda raw: os.urandom(512), ""),
}


@pytest.fixture
def damaged_json(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, Path, str]:
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    new_conversation(store, CID, 4, title="t")
    store.close()
    path = local_path(url) / f"{CID}.json"
    damage, word = JSON_DAMAGE[request.param]
    path.write_bytes(damage(path.read_bytes()))
    return url, path, word


@pytest.mark.invariant(6)
@pytest.mark.parametrize("damaged_json", list(JSON_DAMAGE), indirect=True)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_damaged_json_transcript(damaged_json: tuple[str, Path, str], command: str) -> None:
    url, path, word = damaged_json
    before = path.read_bytes()
    result = invoke(COMMANDS[command], store=url)
    assert path.read_bytes() == before, "the damaged file was written over"
    listed = invoke(["list", "--json"], store=url)
    assert listed.code == 0, listed.err
    assert CID in [row["id"] for row in listed.json()], listed.err
    assert path.read_bytes() == before
    assert_one_error(result, str(path), word)


# -- damaged SQLite stores ------------------------------------------------------------------

def _rows(path: Path) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT conversation_id, seq, CAST(body AS BLOB), hash "
                          "FROM messages ORDER BY seq").fetchall()
    finally:
        db.close()


def _sql(*statements: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        db = sqlite3.connect(path)
        try:
            for statement in statements:
                db.execute(statement)
            db.commit()
        finally:
            db.close()
    return damage


def _overwrite(data: bytes) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        for side in (".db-wal", ".db-shm"):
            path.with_suffix(side).unlink(missing_ok=True)
        path.write_bytes(data)
    return damage


def _foreign(path: Path) -> None:
    _overwrite(b"")(path)
    _sql("CREATE TABLE recipes (name TEXT)", "INSERT INTO recipes VALUES ('soup')")(path)


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) // 2])


SQLITE_DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "not-a-database": (_overwrite(b"these are my notes, not a database\n" * 40), "not a"),
    "foreign-database": (_foreign, "not a chatstate store"),
    "truncated": (_truncate, ""),
    "future-schema": (_sql("PRAGMA user_version=99"), "schema version 99"),
    "tampered-row": (_sql("UPDATE messages SET body=replace(body, 'msg 2', 'msg 2, edited') "
                          "WHERE seq=2"), "seq 2"),
    "wrong-type-row": (_sql("UPDATE messages SET body=replace(body, '\"seq\":1', "
                            "'\"seq\":\"one\"') WHERE seq=1"), "seq 1"),
    "undecodable-row": (_sql("UPDATE messages SET body=CAST(replace(CAST(body AS BLOB), "
                             "CAST('msg 1' AS BLOB), x'6d7367ff31') AS TEXT) WHERE seq=1"),
                        "seq 1"),
}


@pytest.fixture
def damaged_sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, Path, str]:
    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    new_conversation(store, CID, 4, title="t")
    store.close()
    path = local_path(url)
    damage, word = SQLITE_DAMAGE[request.param]
    damage(path)
    return url, path, word


def _state(path: Path) -> object:
    """What must not change: the rows when SQLite can still read them, else the bytes."""
    try:
        return _rows(path)
    except sqlite3.DatabaseError:
        return path.read_bytes()


@pytest.mark.invariant(6)
@pytest.mark.parametrize("damaged_sqlite", list(SQLITE_DAMAGE), indirect=True)
@pytest.mark.parametrize("command", [*COMMANDS, "list"])
def test_damaged_sqlite_store(damaged_sqlite: tuple[str, Path, str], command: str) -> None:
    url, path, word = damaged_sqlite
    before = _state(path)
    result = invoke(COMMANDS.get(command, ["list"]), store=url)
    assert _state(path) == before, "the damaged store was written over"
    if command == "list" and result.code == 0:  # the rows are damaged, not the index
        assert CID in result.out
        return
    error = error_paragraph(result)
    assert "check the disk" not in error, error
    assert_one_error(result, str(path), word)


# -- hostile ids ----------------------------------------------------------------------------

BAD_IDS = {"slash": "a/b", "dotdot": "..", "escape": "../outside", "nul": "a\x00b",
           "long": "x" * 300}


@pytest.mark.parametrize("bad", list(BAD_IDS))
def test_hostile_ids_are_refused_before_anything_is_written(local_store_url: str,
                                                           tmp_path: Path, bad: str) -> None:
    cid = BAD_IDS[bad]
    store = open_store(local_store_url)
    new_conversation(store, "kept", 2)
    store.close()
    doc = tmp_path / "in.json"
    doc.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    before = snapshot(tmp_path)
    for args in (["replay", cid], ["ask", "--model", "fake", "--id", cid, "hi"],
                 ["import", str(doc), "--id", cid], ["rm", cid, "--yes"],
                 ["export", cid, "-o", "-"]):
        result = invoke(args, store=local_store_url)
        assert_usage_or_error(result, "invalid conversation id")
    after = snapshot(tmp_path)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed <= {"store/.chatstate/opens.jsonl", "s.db", "s.db-wal", "s.db-shm"}, \
        changed  # only the open records (SQLite keeps them in the database)
    assert [r["id"] for r in invoke(["list", "--json"], store=local_store_url).json()] == \
        ["kept"]


@pytest.mark.parametrize("bad", [*BAD_IDS.values(), ""], ids=[*BAD_IDS, "empty"])
def test_hostile_ids_through_the_library(local_store_url: str, bad: str) -> None:
    """NUL cannot travel in a real argv; the library refuses it (and the rest) itself."""
    with pytest.raises(InvalidConversationId):
        validate_id(bad)
    store = open_store(local_store_url)
    try:
        calls: list[Callable[[], object]] = [
            lambda: store.create(Conversation.model_construct(id=bad)),
            lambda: store.load(bad), lambda: store.append(bad, seal_chain(1))]
        for call in calls:
            with pytest.raises(InvalidConversationId):
                call()
        assert store.list_conversations() == []
    finally:
        store.close()


# -- a 10 MB message ------------------------------------------------------------------------

def test_ten_megabyte_message_round_trips_through_the_cli(local_store_url: str,
                                                          tmp_path: Path) -> None:
    big = ("0123456789abcdef" * (10 * 65536))[:10_000_000]
    env = {"CHATSTATE_FAKE_REPLY_WORDS": "2"}
    asked = invoke(["ask", "--model", "fake", "--no-stream", "--id", "big", "-"],
                   store=local_store_url, input=big, env=env)
    assert asked.code == 0, asked.err[-2000:]
    shown = invoke(["replay", "big", "--format", "json"], store=local_store_url)
    assert shown.code == 0, shown.err
    messages = shown.json()["messages"]
    assert messages[0]["content"] == big
    assert big in messages[1]["content"]
    out = tmp_path / "big.json"
    assert invoke(["export", "big", "-o", str(out)], store=local_store_url).code == 0
    imported = invoke(["import", str(out), "--id", "big2"], store=local_store_url)
    assert imported.code == 0, imported.err
    again = invoke(["replay", "big2", "--format", "json", "--verify"], store=local_store_url)
    assert again.code == 0
    assert again.json()["messages"] == messages


# -- import files that are not transcripts -----------------------------------------------

def _export(tmp_path: Path) -> bytes:
    url = f"json://{tmp_path}/source"
    store = open_store(url)
    new_conversation(store, "src", 4, title="t")
    store.close()
    out = tmp_path / "export.json"
    assert invoke(["export", "src", "-o", str(out)], store=url).code == 0
    return out.read_bytes()


def _edit_export(edit: Callable[[dict[str, object]], None]) -> Callable[[Path], bytes]:
    def make(tmp_path: Path) -> bytes:
        doc = json.loads(_export(tmp_path))
        edit(doc)
        return json.dumps(doc).encode()
    return make


def _messages(doc: dict[str, object]) -> list[dict[str, object]]:
    messages = doc["messages"]
    assert isinstance(messages, list)
    return messages


IMPORTS: dict[str, Callable[[Path], bytes]] = {
    "empty": lambda tmp: b"",
    "binary": lambda tmp: os.urandom(2048),
    "invalid-utf8": lambda tmp: b'[{"role": "user", "content": "caf\xe9"}]',
    "truncated-export": lambda tmp: _export(tmp)[:300],
    "future-schema": _edit_export(lambda d: d.update(schema=99)),
    "escaping-id": _edit_export(lambda d: d.update(id="../../outside")),
    "wrong-types": _edit_export(lambda d: _messages(d)[1].update(seq="one")),
    "duplicated-message": _edit_export(lambda d: _messages(d).insert(1, _messages(d)[1])),
    "content-not-text": lambda tmp: b'[{"role": "user", "content": 5}]',
    "nested-garbage": lambda tmp: b'{"messages": {"role": "user"}}',
}


@pytest.mark.parametrize("case", list(IMPORTS))
def test_import_of_what_is_not_a_transcript(local_store_url: str, tmp_path: Path,
                                            case: str) -> None:
    path = tmp_path / "in.json"
    path.write_bytes(IMPORTS[case](tmp_path))
    before = path.read_bytes()
    result = invoke(["import", str(path)], store=local_store_url)
    assert path.read_bytes() == before
    listed = invoke(["list", "--json"], store=local_store_url)
    assert listed.code == 0, "something was imported"
    assert listed.json() == [], "something was imported"
    assert not (tmp_path.parent / "outside.json").exists()
    assert_one_error(result, str(path))


def test_import_usage_errors(local_store_url: str, tmp_path: Path) -> None:
    for args in (["import", str(tmp_path / "missing.json")], ["import", str(tmp_path)]):
        result = invoke(args, store=local_store_url)
        assert_usage_or_error(result, "PATH")
        assert result.code == 2


# -- the same, as a real process ------------------------------------------------------------

def test_real_process_shows_one_paragraph_and_no_traceback(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    json_url = f"json://{tmp_path}/store"
    store = open_store(json_url)
    new_conversation(store, CID, 4)
    store.close()
    path = local_path(json_url) / f"{CID}.json"
    path.write_bytes(path.read_bytes()[:200])
    db = tmp_path / "notes.db"
    db.write_text("not a database\n")
    for url, args, where in ((json_url, ["replay", CID], path),
                             (json_url, ["ask", "--model", "fake", "--id", CID, "hi"], path),
                             (f"sqlite://{db}", ["list"], db)):
        before = where.read_bytes()
        result = run_cli(args, env, store=url)
        assert_one_error(result, str(where))
        assert where.read_bytes() == before
    bad = run_cli(["replay", "../x"], env, store=json_url)
    assert_usage_or_error(bad, "invalid conversation id")


def test_message_with_every_kind_of_bad_text_is_refused_or_kept_exactly(
        local_store_url: str) -> None:
    """Lone surrogates cannot be stored as UTF-8: refused. Control characters can: kept."""
    store = open_store(local_store_url)
    try:
        store.create(Conversation(id="text"))
        odd = Message.seal(None, role="user", content="nul\x00 esc\x1b[2J bidi\u202e end",
                           turn_id="t")
        store.append("text", [odd])
        assert store.load("text").messages == [odd]
    finally:
        store.close()
    shown = invoke(["replay", "text", "--format", "json"], store=local_store_url)
    assert shown.code == 0
    assert shown.json()["messages"][0]["content"] == odd.content
