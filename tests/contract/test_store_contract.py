"""The store contract, once, for every store (json, sqlite, and s3 when it is built).

Proves: create/load/list/delete; 1,000 appends reload with a valid chain;
compare-and-append refuses stale writers and writes nothing; a retried append
never duplicates; the one partial reply is saved, replaced, cleared, and cleared
by the append of its seq; headers, open records and ``check()``; ids that could
escape the store are refused before any I/O; a document from a newer chatstate
is refused and left alone; two processes racing on one conversation lose nothing.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from support.stores import (
    assert_acked_present,
    local_path,
    new_conversation,
    parse_acks,
    scheme,
    seal_chain,
    snapshot,
    spawn_writer,
    stored_state,
    tamper,
)

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    ConflictError,
    ConversationNotFound,
    CorruptTranscriptError,
    InvalidConversationId,
    SchemaVersionError,
)
from chatstate.stores import open_store

# -- create / load / list / delete ---------------------------------------------------------


def test_create_then_load_empty(store: Any) -> None:
    store.create(Conversation(id="c1", title="hello", metadata={"k": [1, "two"]}))
    conv = store.load("c1")
    assert (conv.id, conv.title, conv.metadata) == ("c1", "hello", {"k": [1, "two"]})
    assert conv.messages == [] and conv.partial is None and conv.verify() is None


def test_create_existing_id_conflicts(store: Any) -> None:
    new_conversation(store, "c1", 2)
    with pytest.raises(ConflictError):
        store.create(Conversation(id="c1"))
    assert len(store.load("c1").messages) == 2


def test_list_newest_first_with_title_and_count(store: Any) -> None:
    assert store.list_conversations() == []
    for cid in ("a", "b", "c"):
        new_conversation(store, cid, {"a": 1, "b": 3, "c": 2}[cid], title=f"title {cid}")
        time.sleep(0.002)
    assert [s.id for s in store.list_conversations()] == ["c", "b", "a"]
    store.append("a", seal_chain(1, store.load("a").last))  # an append makes it newest
    listed = store.list_conversations()
    assert [(s.id, s.title, s.message_count) for s in listed] == [
        ("a", "title a", 2), ("c", "title c", 2), ("b", "title b", 3)]
    assert listed[0].updated_at > listed[1].updated_at
    assert [s.id for s in store.list_conversations(limit=2)] == ["a", "c"]


def test_list_survives_metadata_that_looks_like_messages(store: Any) -> None:
    new_conversation(store, "m", 1, title="t", metadata={"a": 1, "messages": [1, 2]})
    store.set_header("m", metadata={"x": 0, "messages": ["looks", "like", "a", "list"]})
    [summary] = store.list_conversations()
    assert (summary.id, summary.title, summary.message_count) == ("m", "t", 1)


def test_delete(store: Any) -> None:
    new_conversation(store, "gone", 3)
    store.save_partial("gone", Message.seal(store.load("gone").last, role="assistant",
                                            content="par", turn_id="t", status="partial"))
    new_conversation(store, "kept", 1)
    store.delete("gone")
    with pytest.raises(ConversationNotFound):
        store.load("gone")
    with pytest.raises(ConversationNotFound):
        store.delete("gone")
    assert [s.id for s in store.list_conversations()] == ["kept"]
    new_conversation(store, "gone", 0)  # the id is free again, with no stale partial
    assert store.load("gone").partial is None and store.load("gone").messages == []


def test_missing_conversation_is_not_found(store: Any) -> None:
    for call in (lambda: store.load("nope"), lambda: store.append("nope", seal_chain(1)),
                 lambda: store.set_header("nope", title="x"),
                 lambda: store.save_partial("nope", seal_chain(1)[0])):
        with pytest.raises(ConversationNotFound) as info:
            call()
        assert "nope" in str(info.value)
        assert isinstance(info.value, KeyError)


# -- appends --------------------------------------------------------------------------------


def test_thousand_appends_then_reload(store_url: str) -> None:
    store = open_store(store_url)
    msgs = new_conversation(store, "long", 1000)
    store.close()
    reopened = open_store(store_url)
    conv = reopened.load("long")
    assert conv.verify() is None
    assert [m.hash for m in conv.messages] == [m.hash for m in msgs]
    assert conv.messages == msgs
    assert reopened.list_conversations()[0].message_count == 1000
    reopened.close()


def test_append_several_at_once(store: Any) -> None:
    msgs = seal_chain(5)
    new_conversation(store, "c1")
    store.append("c1", msgs[:3])
    store.append("c1", msgs[3:])
    assert store.load("c1").messages == msgs


@pytest.mark.invariant(5)
def test_stale_expected_seq_conflicts_and_writes_nothing(store: Any) -> None:
    msgs = new_conversation(store, "c1", 4)
    ahead = seal_chain(3, msgs[-1])[2:]  # seq 6 while the store is at 3
    with pytest.raises(ConflictError) as info:
        store.append("c1", ahead)
    assert (info.value.expected_seq, info.value.actual_seq) == (5, 3)
    assert store.load("c1").messages == msgs


@pytest.mark.invariant(5)
def test_message_chained_off_stale_last_hash_conflicts(store: Any) -> None:
    msgs = new_conversation(store, "c1", 2)
    ours = Message.seal(msgs[-1], role="user", content="ours", turn_id="t-a")
    theirs = Message.seal(msgs[-1], role="user", content="theirs", turn_id="t-b")
    store.append("c1", [theirs])  # the other writer wins seq 2
    for attempt in ([ours], [ours, Message.seal(ours, role="assistant", content="r",
                                                turn_id="t-a")]):
        with pytest.raises(ConflictError):
            store.append("c1", attempt)
    # a message sealed off our (never stored) seq 2 does not chain from theirs
    with pytest.raises(ConflictError):
        store.append("c1", [Message.seal(ours, role="assistant", content="r", turn_id="t-a")])
    assert store.load("c1").messages == [*msgs, theirs]
    assert store.list_conversations()[0].message_count == 3


@pytest.mark.invariant(5)
def test_conflict_leaves_partial_alone(store: Any) -> None:
    msgs = new_conversation(store, "c1", 1)
    partial = Message.seal(msgs[-1], role="assistant", content="half", turn_id="t",
                           status="partial")
    store.save_partial("c1", partial)
    with pytest.raises(ConflictError):
        store.append("c1", seal_chain(2, msgs[-1])[1:])
    assert store.load("c1").partial == partial


def test_unsealed_chain_is_refused(store: Any) -> None:
    msgs = new_conversation(store, "c1", 1)
    good = seal_chain(2, msgs[-1])
    forged = good[1].model_copy(update={"content": "forged"})
    with pytest.raises(CorruptTranscriptError):
        store.append("c1", [good[0], forged])
    assert store.load("c1").messages == msgs


@pytest.mark.invariant(5)
def test_retried_append_never_duplicates(store: Any) -> None:
    msgs = new_conversation(store, "c1", 1)
    batch = seal_chain(2, msgs[-1])
    store.append("c1", batch)
    store.append("c1", batch)  # "outcome unknown" -> retry of what landed: a no-op
    store.append("c1", batch[1:])
    more = seal_chain(1, batch[-1])
    store.append("c1", [*batch, *more])  # a retry that overlaps: only the new one lands
    conv = store.load("c1")
    assert conv.messages == [*msgs, *batch, *more] and conv.verify() is None


# -- partial replies -----------------------------------------------------------------------


def test_partial_save_replace_load_clear(store_url: str) -> None:
    store = open_store(store_url)
    msgs = new_conversation(store, "c1", 1)
    assert store.load("c1").partial is None
    for text in ("Hel", "Hello, wor"):
        partial = Message.seal(msgs[-1], role="assistant", content=text, turn_id="t-1",
                               status="partial")
        store.save_partial("c1", partial)
        assert store.load("c1").partial == partial
    store.close()
    store = open_store(store_url)  # an interrupted reply survives a restart
    assert store.load("c1").partial == partial
    assert store.load("c1").messages == msgs
    store.clear_partial("c1")
    assert store.load("c1").partial is None
    store.clear_partial("c1")  # clearing nothing is fine
    store.close()


@pytest.mark.invariant(5)
def test_partial_for_wrong_seq_conflicts(store: Any) -> None:
    msgs = new_conversation(store, "c1", 2)
    stale = Message.seal(msgs[0], role="assistant", content="x", turn_id="t",
                         status="partial")
    with pytest.raises(ConflictError):
        store.save_partial("c1", stale)
    assert store.load("c1").partial is None


def test_append_clears_the_partial_of_that_seq(store: Any) -> None:
    msgs = new_conversation(store, "c1", 1)
    store.save_partial("c1", Message.seal(msgs[-1], role="assistant", content="Hel",
                                          turn_id="t-1", status="partial"))
    reply = Message.seal(msgs[-1], role="assistant", content="Hello", turn_id="t-1")
    store.append("c1", [reply])
    conv = store.load("c1")
    assert conv.partial is None and conv.messages == [*msgs, reply]
    nxt = Message.seal(reply, role="assistant", content="next", turn_id="t-2",
                       status="partial")
    store.save_partial("c1", nxt)  # the next partial is independent of the cleared one
    assert store.load("c1").partial == nxt


# -- header, bookkeeping, readiness -----------------------------------------------------------


def test_set_header(store: Any) -> None:
    msgs = new_conversation(store, "c1", 2, title="old")
    before = store.load("c1")
    time.sleep(0.002)
    store.set_header("c1", title="new title")
    store.set_header("c1", metadata={"tags": ["a"], "n": 1})
    conv = store.load("c1")
    assert (conv.title, conv.metadata) == ("new title", {"tags": ["a"], "n": 1})
    assert conv.messages == msgs and conv.created_at == before.created_at
    assert conv.updated_at > before.updated_at
    assert store.list_conversations()[0].title == "new title"


def test_check_writes_reads_and_deletes_a_probe(store: Any) -> None:
    report = store.check()
    assert report.ok, report.error
    assert report.error is None and len(report.steps) >= 3
    assert report.url == store.url
    assert store.check().ok  # and again: the probe was cleaned up
    if scheme(store.url) == "json":
        assert not list((local_path(store.url) / ".chatstate").glob("*probe*"))


def test_every_open_is_recorded(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    open_store(store_url).close()
    monkeypatch.setenv("DEPLOY_ID", "deploy-42")
    store = open_store(store_url)
    opens = store.opens()
    assert len(opens) == 2
    assert opens[-1]["deploy_id"] == "deploy-42" and opens[0]["deploy_id"] != "deploy-42"
    for rec in opens:
        assert {"boot_id", "hostname", "deploy_id", "opened_at", "pid"} <= set(rec)
    assert opens[0]["opened_at"] <= opens[1]["opened_at"]
    store.record_open({"note": "by hand"})
    assert store.opens()[-1] == {"note": "by hand"}
    store.close()


# -- hostile ids ---------------------------------------------------------------------------

BAD_IDS = {"slash": "a/b", "parent": "../escape", "dotdot": "..", "dot": ".", "nul": "x\0y",
           "300chars": "z" * 300, "empty": "", "backslash": "a\\b", "absolute": "/abs",
           "space": "sp ace", "newline": "a\nb"}


@pytest.mark.parametrize("bad", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_invalid_ids_are_refused_before_any_io(store: Any, tmp_path: Path, bad: str) -> None:
    new_conversation(store, "ok", 1)
    before = {p for p in tmp_path.rglob("*")}
    msg = seal_chain(1)[0]
    calls = {
        "create": lambda: store.create(Conversation(id=bad)),
        "load": lambda: store.load(bad),
        "append": lambda: store.append(bad, [msg]),
        "save_partial": lambda: store.save_partial(bad, msg),
        "clear_partial": lambda: store.clear_partial(bad),
        "set_header": lambda: store.set_header(bad, title="t"),
        "delete": lambda: store.delete(bad),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidConversationId) as info:
            call()
        assert isinstance(info.value, ValueError), name
    assert {p for p in tmp_path.rglob("*")} - before == set()
    assert not (tmp_path.parent / "escape.json").exists()
    assert [s.id for s in store.list_conversations()] == ["ok"]


# -- schema versions -----------------------------------------------------------------------


def _from_the_future(url: str, cid: str) -> None:
    """Rewrite the stored document of ``cid`` as if a newer chatstate had written it."""
    kind = scheme(url)
    if kind == "json":
        path = local_path(url) / f"{cid}.json"
        raw = path.read_bytes()
        assert raw.startswith(b'{"schema":1,')
        path.write_bytes(b'{"schema":99,' + raw[len(b'{"schema":1,'):])
    elif kind == "sqlite":
        with sqlite3.connect(local_path(url)) as db:
            db.execute("PRAGMA user_version=99")
        db.close()
    else:
        raise AssertionError(f"no raw access to {kind} documents here")


@pytest.mark.invariant(6)
def test_schema_from_the_future_is_refused_and_untouched(local_store_url: str) -> None:
    # Local stores only: the s3 variant (a segment rewritten with schema 99, refused and
    # left as it is) is in test_s3_store.py::test_tampered_message_is_named_and_left_alone.
    store_url = local_store_url
    store = open_store(store_url)
    new_conversation(store, "c1", 2)
    store.close()
    _from_the_future(store_url, "c1")
    path = local_path(store_url)
    before = snapshot(path)
    if scheme(store_url) == "sqlite":  # one schema for the whole database: open refuses
        with pytest.raises(SchemaVersionError) as opening:
            open_store(store_url)
        refusals = [opening.value]
    else:  # one schema per conversation file: the store opens, the conversation is refused
        store = open_store(store_url)
        try:
            with pytest.raises(SchemaVersionError) as loading:
                store.load("c1")
            with pytest.raises(SchemaVersionError) as appending:
                store.append("c1", seal_chain(3)[2:])
        finally:
            store.close()
        refusals = [loading.value, appending.value]
    for refusal in refusals:
        text = str(refusal)
        assert str(path) in text and "99" in text and "upgrade chatstate" in text, text
    after = snapshot(path)
    key = path.name if path.is_file() else "c1.json"
    assert after[key] == before[key]


# -- two processes --------------------------------------------------------------------------


@pytest.mark.invariant(5)
def test_two_processes_appending_lose_nothing(store_url: str) -> None:
    store = open_store(store_url)
    new_conversation(store, "race", 1)
    per_writer = 25
    writers = [spawn_writer("contend", store_url, "race", str(per_writer)) for _ in range(2)]
    try:
        for expect in ("ready\n", "sealed\n"):  # both seal their first message on one head
            for w in writers:
                assert w.stdout is not None and w.stdout.readline() == expect
            for w in writers:  # then release both at once, so they really race
                assert w.stdin is not None
                w.stdin.write("go\n")
                w.stdin.flush()
        outs = [w.communicate(timeout=120) for w in writers]
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
    acks, conflicts = [], 0
    for w, (out, err) in zip(writers, outs, strict=True):
        assert w.returncode == 0, err
        mine = parse_acks(out)
        assert len(mine) == per_writer
        acks += mine
        conflicts += int(out.split("conflicts ")[1])
    # both sealed their first message on the same head: one of the two appends must lose
    assert conflicts >= 1, "the two writers never raced: nothing was tested"
    conv = store.load("race")
    assert conv.verify() is None
    assert len(conv.messages) == 1 + len(acks) == 1 + 2 * per_writer
    assert_acked_present(conv.messages, acks)
    store.close()


ODD_IDS = [".hidden", ".x.tmp-1", ".x.json.tmp-0123456789abcdef", "a.tmp-b", "-", "_..._",
           "A" * 128, "partials", ".partials", ".locks", ".chatstate"]


def test_valid_but_odd_ids_survive_reopen(store_url: str) -> None:
    store = open_store(store_url)
    for cid in ODD_IDS:
        new_conversation(store, cid, 2)
        store.save_partial(cid, Message.seal(store.load(cid).last, role="user", content="p",
                                             turn_id="t", status="partial"))
    store.close()
    store = open_store(store_url)  # recovery must not mistake any of them for debris
    assert sorted(s.id for s in store.list_conversations()) == sorted(ODD_IDS)
    for cid in ODD_IDS:
        conv = store.load(cid)
        assert len(conv.messages) == 2 and conv.partial is not None, cid
    store.close()



# -- damage is never written over --------------------------------------------------------


@pytest.mark.invariant(6)
def test_writes_onto_a_chain_that_does_not_verify_are_refused(store_url: str) -> None:
    """append, save_partial and set_header check the chain first, on every store."""
    store = open_store(store_url)
    msgs = new_conversation(store, "c1", 3)
    tamper(store_url, store, "c1", 1)
    before = stored_state(store_url, store)
    writers = [open_store(store_url)]  # another process, nothing cached
    # local stores also see it through their own cache; shared ones (s3, postgresql)
    # re-verify when the head moved, and a fresh writer always verifies
    if scheme(store_url) not in ("s3", "postgresql"):
        writers.append(store)
    for writer in writers:
        writes = {
            "append": lambda w=writer: w.append("c1", seal_chain(1, msgs[-1])),
            "save_partial": lambda w=writer: w.save_partial("c1", Message.seal(
                msgs[-1], role="user", content="half", turn_id="t-1", status="partial")),
            "set_header": lambda w=writer: w.set_header("c1", title="renamed"),
        }
        for name, write in writes.items():
            with pytest.raises(CorruptTranscriptError) as info:
                write()
            assert info.value.position == 1, (name, str(info.value))
        assert stored_state(store_url, store) == before
    with pytest.raises(CorruptTranscriptError):
        open_store(store_url).load("c1")
