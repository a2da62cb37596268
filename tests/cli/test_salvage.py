"""`repair --salvage` and `import --salvage`: a damaged conversation is recovered up to its
first break as a new conversation; the damaged bytes are only ever read."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import cli_env, invoke, replay_json


def three_turns(store: str, env: dict[str, str], cid: str = "k") -> None:
    for text in ("first", "second", "third"):
        done = invoke(["ask", "--model", "fake", "--id", cid, text], store=store, env=env)
        assert done.code == 0, done.err


def import_cut_inside_seq_4(tmp_path: Path, store: str, env: dict[str, str]
                            ) -> tuple[Any, bytes, Path]:
    """Conversation k's file cut short inside seq 4, set aside, and salvaged as 'back'."""
    raw = (tmp_path / "s" / "k.json").read_bytes()
    cut = raw[: raw.index(b'"seq":4') + 20]  # the file ends inside seq 4
    aside = tmp_path / "cut.json"
    aside.write_bytes(cut)
    return invoke(["import", "--salvage", str(aside), "--id", "back"], store=store,
                  env=env), cut, aside


def quarantined(root: Path) -> list[Path]:
    return sorted((root / ".quarantine").iterdir())


def test_a_chain_break_keeps_what_comes_before_it(tmp_path: Path) -> None:
    store, env = f"json://{tmp_path}/s", cli_env(tmp_path)
    three_turns(store, env)
    page = tmp_path / "s" / "k.json"
    doc = json.loads(page.read_text())
    doc["messages"][3]["content"] = "edited by someone"  # the chain breaks at seq 3
    page.write_text(json.dumps(doc))
    damaged = page.read_bytes()

    done = invoke(["repair", "k", "--salvage"], store=store, env=env)
    assert done.code == 0, done.err
    assert done.out.strip() == "k-salvaged"
    assert "salvaged 3 of the 6 message(s)" in done.err
    assert "the hash chain breaks at seq 3" in done.err
    [moved] = quarantined(tmp_path / "s")
    assert moved.read_bytes() == damaged  # the damaged file, byte for byte
    kept = replay_json(store, "k-salvaged")["messages"]
    assert [m["content"] for m in kept if m["role"] == "user"] == ["first", "second"]
    assert invoke(["replay", "k-salvaged", "--verify"], store=store, env=env).code == 0
    # and the salvaged conversation goes on like any other
    more = invoke(["ask", "--model", "fake", "--id", "k-salvaged", "fourth"], store=store,
                  env=env)
    assert more.code == 0, more.err


def test_a_file_cut_short_is_read_line_by_line(tmp_path: Path) -> None:
    store, env = f"json://{tmp_path}/s", cli_env(tmp_path)
    three_turns(store, env)
    done, cut, aside = import_cut_inside_seq_4(tmp_path, store, env)
    assert done.code == 0, done.err
    assert "salvaged 4 of the 4 message(s)" in done.err
    assert aside.read_bytes() == cut
    assert len(replay_json(store, "back")["messages"]) == 4


def test_a_moved_aside_file_imports_back_as_it_is(tmp_path: Path) -> None:
    store, env = f"json://{tmp_path}/s", cli_env(tmp_path)
    three_turns(store, env)
    before = replay_json(store, "k")["messages"]
    assert invoke(["repair", "k", "--force"], store=store, env=env).code == 0
    [moved] = quarantined(tmp_path / "s")
    back = invoke(["import", str(moved)], store=store, env=env)
    assert back.code == 0, back.err
    assert replay_json(store, "k")["messages"] == before


def test_sqlite_row_dump_is_salvaged(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store, env = f"sqlite://{db}", cli_env(tmp_path)
    three_turns(store, env)
    with sqlite3.connect(db) as conn:
        body = json.loads(conn.execute("SELECT body FROM messages WHERE seq=5").fetchone()[0])
        body["content"] = "tampered"
        conn.execute("UPDATE messages SET body=? WHERE seq=5", (json.dumps(body),))
    done = invoke(["repair", "k", "--salvage", "--as", "rescued"], store=store, env=env)
    assert done.code == 0, done.err
    assert "salvaged 5 of the 6 message(s)" in done.err, done.err
    assert len(replay_json(store, "rescued")["messages"]) == 5


def test_nothing_readable_is_a_clear_error(tmp_path: Path) -> None:
    store, env = f"json://{tmp_path}/s", cli_env(tmp_path)
    junk = tmp_path / "junk.json"
    junk.write_bytes(b"\x00\x01 not a transcript")
    done = invoke(["import", "--salvage", str(junk)], store=store, env=env)
    assert done.code == 1
    assert str(junk) in done.err and "no message of a chatstate transcript" in done.err


@pytest.mark.parametrize("args", [["repair", "k", "--as", "x"]])
def test_as_needs_salvage(tmp_path: Path, args: list[str]) -> None:
    done = invoke(args, store=f"json://{tmp_path}/s", env=cli_env(tmp_path))
    assert done.code == 2 and "--salvage" in done.err


def test_the_json_stores_append_log_is_read_too(tmp_path: Path) -> None:
    """A file a writer never compacted (killed, or serve) holds log records after the
    document: salvage reads them, up to a record cut short at the end."""
    from chatstate.stores import open_store
    from chatstate.testing.store_contract import new_conversation

    store = open_store(f"json://{tmp_path}/s")
    new_conversation(store, "k", 6)  # six appends, never closed: never compacted
    raw = (tmp_path / "s" / "k.json").read_bytes()
    assert raw.count(b"\t") >= 2, "the appends went to the log"
    aside = tmp_path / "aside.json"
    aside.write_bytes(raw[:-15])  # the last record cut short, as a crash would
    done = invoke(["import", "--salvage", str(aside), "--id", "back"],
                  store=f"json://{tmp_path}/t", env=cli_env(tmp_path))
    assert done.code == 0, done.err
    assert "salvaged 5 of the 5 message(s)" in done.err, done.err  # all but the cut one
    store.close()


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_a_line_separator_inside_a_message_does_not_cut_its_line(tmp_path: Path,
                                                                 separator: str) -> None:
    # The json store writes UTF-8 as it is, so these reach the file raw; str.splitlines
    # ends a line at each of them, and the message around it was lost to the salvage.
    store, env = f"json://{tmp_path}/s", cli_env(tmp_path)
    for text in ("first", f"two{separator}lines", "third"):
        done = invoke(["ask", "--model", "fake", "--id", "k", text], store=store, env=env)
        assert done.code == 0, done.err
    assert separator.encode() in (tmp_path / "s" / "k.json").read_bytes()  # raw, not escaped
    done, _, _ = import_cut_inside_seq_4(tmp_path, store, env)
    assert done.code == 0, done.err
    assert "salvaged 4 of the 4 message(s)" in done.err
    kept = replay_json(store, "back")["messages"]
    assert kept[2]["content"] == f"two{separator}lines"


@pytest.mark.invariant(6)
@pytest.mark.parametrize("table", ["messages", "partials"])
def test_sqlite_quarantine_keeps_bytes_that_are_not_utf8_exactly(tmp_path: Path,
                                                                   table: str) -> None:
    # the damage a dump is made for: a flipped bit in a stored body. The dump must hold
    # those very bytes (they were replaced by U+FFFD, then the rows deleted), and a
    # damaged partial reply must not stop the repair
    db = tmp_path / "s.db"
    store, env = f"sqlite://{db}", cli_env(tmp_path)
    for text in ("café one", "café two"):
        done = invoke(["ask", "--model", "fake", "--id", "k", text], store=store, env=env)
        assert done.code == 0, done.err
    with sqlite3.connect(db) as conn:
        if table == "partials":
            conn.execute("INSERT INTO partials (conversation_id, seq, body) VALUES "
                         "('k', 4, CAST(? AS BLOB))",
                         (json.dumps({"role": "assistant", "content": "café partial",
                                      "seq": 4}, ensure_ascii=False),))
        where = "seq=3" if table == "messages" else "conversation_id='k'"
        raw = conn.execute(f"SELECT CAST(body AS BLOB) FROM {table} WHERE {where}"
                           ).fetchone()[0]
        bad = raw.replace("é".encode(), b"\xa9\xc3\x28")
        assert bad != raw
        conn.execute(f"UPDATE {table} SET body=? WHERE {where}", (bad,))
    done = invoke(["repair", "k", "--force"], store=store, env=env)
    assert done.code == 0, done.err
    [dump] = quarantined(tmp_path)
    rows = json.loads(dump.read_bytes())
    kept = rows["messages"][3][1] if table == "messages" else rows["partial"][1]
    assert kept.encode("utf-8", "surrogateescape") == bad
    salvaged = invoke(["import", "--salvage", str(dump), "--id", "back"], store=store, env=env)
    assert salvaged.code == 0, salvaged.err
    assert len(replay_json(store, "back")["messages"]) == (3 if table == "messages" else 4)
