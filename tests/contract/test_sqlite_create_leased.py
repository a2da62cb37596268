"""The sqlite store's short way to start a conversation, and where it must take the long one.

``create_leased`` of an id no lease row names writes the lease row, the head row and
the message rows and reads nothing back (``SqliteStore._create_new``). The leases
table has no foreign key, so a lease row can exist for an id with no conversation (a
lease taken on an id never created, a writer killed before its first write): then the
row is judged as ever, here through real holder processes. Also here: the fenced
head read in one query keeps LeaseLost before ConversationNotFound, the commit
group's one ``data_version`` read still sees another connection's commit, and a
group of ``create_leased`` calls in which some fail commits the others.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SUPPORT
from support.stores import fresh_load, seal_chain
from support.threads import run_together

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    ConflictError,
    ConversationInUse,
    ConversationNotFound,
    CorruptTranscriptError,
    LeaseLost,
)
from chatstate.stores import open_store
from chatstate.stores.base import create_leased

HOLDER = SUPPORT / "lease_holder.py"
SLOW_COMMIT = 0.004  # as in test_sqlite_group_commit: writers queue behind a commit


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path}/s.db"


def holder(url: str, cid: str, term: float = 300) -> subprocess.Popen[str]:
    """A process holding ``cid``'s lease (no conversation is created)."""
    proc = subprocess.Popen([sys.executable, str(HOLDER), url, cid, str(term)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("held "), line
    return proc


def traced(store: Any, slow: float = 0.0) -> list[str]:
    statements: list[str] = []

    def trace(statement: str) -> None:
        statements.append(statement)
        if slow and statement.strip().upper() == "COMMIT":
            time.sleep(slow)

    store.db.set_trace_callback(trace)
    return statements


def test_a_new_conversation_is_written_without_reading_anything_back(url: str) -> None:
    store = open_store(url)
    statements = traced(store)
    msgs = seal_chain(2)
    lease = create_leased(store, Conversation(id="c1", title="t", metadata={"k": 1}), msgs,
                          owner="me-1")
    store.db.set_trace_callback(None)
    writes = [s for s in statements if s.split()[0].upper() not in ("BEGIN", "COMMIT")]
    assert not [s for s in writes if s.lstrip().upper().startswith("SELECT")], writes
    # (one PRAGMA data_version, the group's, to know the chain it wrote as verified)
    assert len([s for s in writes if s.lstrip().upper().startswith("PRAGMA")]) <= 1, writes
    assert [s.split()[2] for s in writes if s.upper().startswith("INSERT INTO")][:2] == \
        ["leases", "conversations"]
    conv = fresh_load(url, "c1")
    assert (conv.title, conv.metadata, conv.messages) == ("t", {"k": 1}, msgs)
    other = open_store(url)
    with pytest.raises(ConversationInUse):
        other.acquire_lease("c1")
    store.append("c1", seal_chain(1, msgs[-1], prefix="next"), fence=lease.owner)
    store.release_lease(lease)
    other.release_lease(other.acquire_lease("c1"))
    assert [m.content for m in fresh_load(url, "c1").messages] == ["msg 0", "msg 1", "next 2"]


def test_a_killed_writers_lease_row_on_a_new_id_is_taken_over_at_once(url: str) -> None:
    proc = holder(url, "c1")
    store = open_store(url)
    with pytest.raises(ConversationInUse, match=f"pid {proc.pid}"):
        create_leased(store, Conversation(id="c1"), seal_chain(2))
    with pytest.raises(ConversationNotFound):
        open_store(url).load("c1")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    msgs = seal_chain(2)
    lease = create_leased(store, Conversation(id="c1"), msgs, owner="taker")
    assert fresh_load(url, "c1").messages == msgs
    with pytest.raises(ConversationInUse, match="pid "):  # the taker holds it now
        open_store(url).acquire_lease("c1")
    store.append("c1", seal_chain(1, msgs[-1]), fence=lease.owner)
    store.release_lease(lease)


def test_a_live_lease_row_on_a_new_id_keeps_it_and_writes_nothing(url: str) -> None:
    proc = holder(url, "c1")
    try:
        store = open_store(url)
        with pytest.raises(ConversationInUse, match=f"pid {proc.pid}"):
            create_leased(store, Conversation(id="c1"), seal_chain(2), wait=0.3)
        with pytest.raises(ConversationNotFound):
            open_store(url).load("c1")
        with pytest.raises(ConversationInUse, match=f"pid {proc.pid}"):  # still the holder's
            open_store(url).acquire_lease("c1")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def test_a_lapsed_lease_row_on_a_new_id_and_its_own_are_taken(url: str) -> None:
    first, second = open_store(url), open_store(url)
    first.acquire_lease("c1", term=0.3)  # never released, never renewed
    time.sleep(0.6)
    msgs = seal_chain(2)
    lease = create_leased(second, Conversation(id="c1"), msgs, owner="second")
    assert fresh_load(url, "c1").messages == msgs
    second.release_lease(lease)
    mine = first.acquire_lease("c2", owner="same-owner")  # a writer re-taking its own
    again = create_leased(first, Conversation(id="c2"), msgs, owner="same-owner")
    assert again.owner == mine.owner
    assert fresh_load(url, "c2").messages == msgs
    first.release_lease(again)


def test_a_new_id_under_an_existing_conversation_conflicts_and_leaves_no_lease(
        url: str) -> None:
    store = open_store(url)
    store.create(Conversation(id="c1", title="first"))
    store.append("c1", seal_chain(1))
    with pytest.raises(ConflictError, match="already exists"):
        create_leased(store, Conversation(id="c1", title="second"), seal_chain(2))
    conv = fresh_load(url, "c1")
    assert (conv.title, [m.content for m in conv.messages]) == ("first", ["msg 0"])
    other = open_store(url)
    other.release_lease(other.acquire_lease("c1"))  # free: the lease row was undone too


def test_the_fenced_head_read_keeps_its_order(url: str) -> None:
    store = open_store(url)
    msgs = seal_chain(1)
    lease = store.acquire_lease("c1", owner="mine")  # a lease, no conversation
    with pytest.raises(ConversationNotFound):
        store.append("c1", msgs, fence=lease.owner)
    with pytest.raises(LeaseLost):  # a fence with no lease recorded: LeaseLost first
        store.append("c2", msgs, fence="nobody")
    with pytest.raises(LeaseLost):
        store.save_partial("c1", msgs[0], fence="someone-else")
    store.create(Conversation(id="c1"))
    store.append("c1", msgs, fence=lease.owner)
    partial = Message.seal(msgs[-1], role="assistant", content="par", status="partial",
                           turn_id="t-1")
    store.save_partial("c1", partial, fence=lease.owner)
    assert fresh_load(url, "c1").partial == partial
    store.release_lease(lease)


@pytest.mark.parametrize("edit", [
    "UPDATE messages SET body = replace(body, 'msg 0', 'msg X') WHERE seq=0",
    # the first hex digit flipped, never set: a hash that began with "f" stayed the same
    "UPDATE messages SET hash = CASE substr(hash, 1, 1) WHEN 'f' THEN 'e' ELSE 'f' END"
    " || substr(hash, 2) WHERE seq=2"],
    ids=["first-body", "tail-hash"])
def test_an_edit_by_another_connection_is_still_seen(url: str, edit: str) -> None:
    """The group reads ``data_version`` once, and an append takes the hash it chains from
    from the head row; a commit by another connection between two groups (a body, or
    the tail row's hash, edited by hand) still makes the next write verify the chain
    again and refuse to write onto the damage."""
    store = open_store(url)
    msgs = seal_chain(2)
    lease = create_leased(store, Conversation(id="c1"), msgs)
    more = seal_chain(1, msgs[-1], prefix="more")
    store.append("c1", more, fence=lease.owner)
    path = url.removeprefix("sqlite://")
    subprocess.run([sys.executable, "-c", (
        "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
        "db.execute(sys.argv[2]); db.commit()"), path, edit], check=True)
    with pytest.raises(CorruptTranscriptError):
        store.append("c1", seal_chain(1, more[-1]), fence=lease.owner)
    assert len(open_store(url).stored_rows("c1")[1]) == 3  # nothing written
    store.release_lease(lease)


@pytest.fixture
def live_holders(url: str) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def test_a_group_of_starts_where_some_fail_commits_the_others(
        url: str, live_holders: list[subprocess.Popen[str]]) -> None:
    """Many threads start conversations at once, their writes grouped into shared
    transactions: those on an existing id (ConflictError), under another process's live
    lease (ConversationInUse) or with a broken chain fail and write nothing; every other
    one is committed whole, its lease held."""
    store = open_store(url)
    threads = 16
    rounds_with_a_shared_failure = 0
    for round_ in range(12):
        ids = [f"r{round_}-c{i}" for i in range(threads)]
        for i in range(0, threads, 4):  # kind 0: the id exists already
            store.create(Conversation(id=ids[i], title="old"))
        live_holders.append(holder(url, ids[1]))  # kind 1 (one per round): live lease
        statements = traced(store, SLOW_COMMIT)
        leases: dict[int, Any] = {}

        def work(i: int, ids: list[str] = ids, leases: dict[int, Any] = leases) -> None:
            msgs = seal_chain(3, prefix=ids[i])
            if i % 4 == 2:  # kind 2: a broken chain
                msgs = [msgs[0], msgs[1].model_copy(update={"content": "edited"})]
            leases[i] = create_leased(store, Conversation(id=ids[i], title="new"), msgs,
                                      owner=f"owner-{ids[i]}")

        errors = run_together(threads, work)
        store.db.set_trace_callback(None)
        for i in range(threads):
            kind = i % 4 if i != 1 else 1
            if kind == 0:
                assert isinstance(errors.get(i), ConflictError), (i, errors.get(i))
                assert fresh_load(url, ids[i]).title == "old"
                assert fresh_load(url, ids[i]).messages == []
                other = open_store(url)  # its lease row was undone with the rest
                other.release_lease(other.acquire_lease(ids[i]))
            elif i == 1:
                assert isinstance(errors.get(i), ConversationInUse), (i, errors.get(i))
                with pytest.raises(ConversationNotFound):
                    open_store(url).load(ids[i])
            elif kind == 2:
                assert isinstance(errors.get(i), CorruptTranscriptError), (i, errors.get(i))
                with pytest.raises(ConversationNotFound):
                    open_store(url).load(ids[i])
            else:
                assert i not in errors, (i, errors[i])
                conv = fresh_load(url, ids[i])
                assert [m.content for m in conv.messages] == \
                    [f"{ids[i]} {n}" for n in range(3)]
                with pytest.raises(ConversationInUse):
                    open_store(url).acquire_lease(ids[i])
                store.release_lease(leases[i])
        commits = sum(1 for s in statements if s.strip().upper() == "COMMIT")
        assert commits < threads, commits  # they were grouped
        if any(s.startswith("ROLLBACK TO") for s in statements):
            rounds_with_a_shared_failure += 1
            if round_ >= 2:
                break
    assert rounds_with_a_shared_failure > 0, "no failed start ever shared a transaction"
