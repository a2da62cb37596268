"""Damage is caught before any write: foreign SQLite files, quarantine order, open records.

Each test here failed before its fix (issue 11, section 2).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from support.stores import new_conversation, seal_chain

from chatstate.batch.ledger import Ledger
from chatstate.core.transcript import Message
from chatstate.durable.guard import inspect
from chatstate.errors import ChatstateError, StoreUnavailable
from chatstate.stores import open_store


def _foreign_db(path: Path) -> bytes:
    db = sqlite3.connect(path)
    with db:
        db.execute("CREATE TABLE notes (body TEXT)")
        db.execute("INSERT INTO notes VALUES ('mine')")
    db.close()
    return path.read_bytes()


@pytest.mark.parametrize("create", [True, False])
def test_batch_ledger_refuses_a_foreign_sqlite_file_without_touching_it(
        tmp_path: Path, create: bool) -> None:
    path = tmp_path / "other.db"
    before = _foreign_db(path)
    with pytest.raises(ChatstateError, match="not a chatstate batch ledger") as info:
        Ledger.open(path, create=create)
    assert str(path) in str(info.value)
    assert "was not changed" in str(info.value)
    assert path.read_bytes() == before  # the header's journal-mode bytes too: not WAL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    db.close()


@pytest.mark.invariant(6)
def test_sqlite_store_refuses_a_foreign_file_without_touching_it(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    before = _foreign_db(path)
    with pytest.raises(ChatstateError, match="not a chatstate store"):
        open_store(f"sqlite://{path}")
    assert path.read_bytes() == before


QUARANTINE_CHILD = r"""
import os, signal, sys
from chatstate.stores import open_store
store = open_store(sys.argv[1])
real, calls = os.rename, []
def rename(src, dst, *a, **kw):  # fault injection: die between the two moves
    calls.append(src)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *a, **kw)
os.rename = rename
store.quarantine("c1")
"""


@pytest.mark.invariant(6)
def test_json_quarantine_killed_between_its_two_moves_loses_nothing(tmp_path: Path) -> None:
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    msgs = new_conversation(store, "c1", 3)
    partial = Message.seal(msgs[-1], role="assistant", content="half a reply", turn_id="t-1",
                           status="partial")
    store.save_partial("c1", partial)
    root = tmp_path / "store"
    store.close()  # (which compacts the json log into the document)
    originals = {(root / "c1.json").read_bytes(), (root / ".partials" / "c1.json").read_bytes()}
    child = subprocess.run([sys.executable, "-c", QUARANTINE_CHILD, url], capture_output=True,
                           text=True, timeout=120, check=False)
    assert child.returncode == -9, child.stderr
    reopened = open_store(url)  # recovery runs here: it must not delete an orphaned partial
    reopened.close()
    kept = {p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert originals <= kept, "a quarantine killed half-way lost the transcript or its partial"


@pytest.mark.invariant(3)
def test_record_open_fsyncs_the_directory_that_gains_opens_jsonl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:  # fault-injection-level spy: which file or directory
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    open_store(f"json://{tmp_path}/store").close()
    meta = str(tmp_path / "store" / ".chatstate")
    opens = meta + "/opens.jsonl"
    assert opens in synced
    assert meta in synced[synced.index(opens):], "opens.jsonl was created but its " \
        "directory entry was never fsynced"
    synced.clear()
    open_store(f"json://{tmp_path}/store").close()  # appending to it: the file's fsync
    assert opens in synced


def test_sqlite_store_still_appends_after_the_shared_setup(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/s.db")
    new_conversation(store, "c1", 2)
    store.append("c1", seal_chain(1, store.load("c1").last))
    assert len(store.load("c1").messages) == 3
    assert store.journal_mode == "wal"
    store.close()


def _fail_directory_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:  # fault injection: EIO on a directory's fsync only
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_an_error_after_the_rename_says_the_data_moved(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"json://{tmp_path}/store")
    new_conversation(store, "c1", 1)
    _fail_directory_fsync(monkeypatch)
    with pytest.raises(StoreUnavailable) as info:  # (an append writes the log: no rename)
        store.set_header("c1", title="renamed")
    text = str(info.value)
    assert "unchanged" not in text, text
    assert "renamed into place" in text
    assert "not known to be on stable storage" in text
    monkeypatch.undo()
    assert store.load("c1").title == "renamed"  # what the message says: it is in place


def test_an_error_before_the_rename_still_says_nothing_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"json://{tmp_path}/store")
    new_conversation(store, "c1", 1)

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StoreUnavailable, match="Previously stored data is unchanged"):
        store.append("c1", seal_chain(1, store.load("c1").last))
    monkeypatch.undo()
    assert len(store.load("c1").messages) == 1


def test_var_tmp_is_not_said_to_be_cleared_on_reboot() -> None:
    report = inspect("/var/tmp/chatstate-store", probe=False)
    text = " ".join(report.reasons)
    assert report.verdict == "ephemeral"
    assert "/var/tmp" in text
    assert "cleared on reboot" not in text
    assert "survives a reboot" in text
    assert "cleared on reboot" in " ".join(inspect("/tmp/x", probe=False).reasons)
