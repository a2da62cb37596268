"""`chatstate repair` moves a damaged transcript aside: the bytes are kept, the id is free."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store

CLI = [sys.executable, "-m", "chatstate"]


def populate(url: str) -> None:
    store = open_store(url)
    store.create(Conversation(id="bad"))
    first = Message.seal(None, role="user", content="hello", turn_id="t1")
    store.append("bad", [first, Message.seal(first, role="assistant", content="hi",
                                             turn_id="t1")])
    store.close()


def chatstate(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "--store", url, *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.invariant(6)
def test_json_repair_moves_the_damaged_file_aside(tmp_path: Path) -> None:
    root = tmp_path / "store"
    url = f"json://{root}"
    populate(url)
    path = root / "bad.json"
    damaged = path.read_bytes().replace(b'"hello"', b'"HELLO"')
    path.write_bytes(damaged)
    assert chatstate(url, "replay", "bad").returncode == 1
    done = chatstate(url, "repair", "bad")
    assert done.returncode == 0, done.stderr
    kept = list((root / ".quarantine").iterdir())
    assert [p.read_bytes() for p in kept] == [damaged]
    assert not path.exists()
    assert chatstate(url, "replay", "bad").returncode == 1  # gone from the store, not lost
    assert chatstate(url, "ask", "--model", "fake", "--id", "bad", "again").returncode == 0


@pytest.mark.invariant(6)
def test_sqlite_repair_dumps_rows_before_removing_them(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    url = f"sqlite://{db}"
    populate(url)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE messages SET body=replace(body, 'hello', 'HELLO') WHERE seq=0")
    assert chatstate(url, "replay", "bad", "--verify").returncode == 1
    done = chatstate(url, "repair", "bad")
    assert done.returncode == 0, done.stderr
    [dump] = list((tmp_path / ".quarantine").iterdir())
    data = json.loads(dump.read_text())
    assert [row[0] for row in data["messages"]] == [0, 1]
    assert "HELLO" in data["messages"][0][1]
    listed = chatstate(url, "list", "--json")
    assert json.loads(listed.stdout) == []


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_repair_of_an_unknown_id_is_a_clear_error(tmp_path: Path, kind: str) -> None:
    url = f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    populate(url)
    done = chatstate(url, "repair", "nope")
    assert done.returncode == 1
    assert "no conversation 'nope'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.invariant(6)
def test_s3_repair_copies_the_objects_aside_before_removing_them(moto_endpoint: str) -> None:
    from support.s3server import new_bucket_url, object_keys, read_object, write_object

    url = new_bucket_url(moto_endpoint)
    populate(url)
    [key] = [k for k in object_keys(url) if "/m/" in k]
    original = read_object(url, key)
    assert original is not None
    assert b'"hello"' in original
    damaged = original.replace(b'"hello"', b'"HELLO"')
    write_object(url, key, damaged)
    assert chatstate(url, "replay", "bad").returncode == 1
    done = chatstate(url, "repair", "bad")
    assert done.returncode == 0, done.stderr
    kept = [k for k in object_keys(url, "quarantine") if k.endswith(key)]
    assert len(kept) == 1
    assert read_object(url, kept[0]) == damaged
    assert object_keys(url, "conversations/bad") == []
    assert chatstate(url, "ask", "--model", "fake", "--id", "bad", "again").returncode == 0


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_repair_leaves_a_healthy_conversation_alone_unless_forced(tmp_path: Path,
                                                                 kind: str) -> None:
    url = f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    populate(url)
    refused = chatstate(url, "repair", "bad")
    assert refused.returncode == 1
    assert "nothing to repair" in refused.stderr
    assert chatstate(url, "replay", "bad", "--verify").returncode == 0
    forced = chatstate(url, "repair", "bad", "--force")
    assert forced.returncode == 0, forced.stderr
    assert chatstate(url, "replay", "bad").returncode == 1
