"""Ported from openai-agents-python tests/extensions/memory/test_sqlalchemy_session.py:
the ordering, concurrency and corrupt-data cases, and the direct operations.

Source: github.com/openai/openai-agents-python, commit
7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7 (vendored in shared/upstream/openai-agents-python).
MIT licence, Copyright (c) 2025 OpenAI; see that folder's LICENSE.

Changes: ``SQLAlchemySession.from_url(...)`` became ``make_session`` (ChatstateSession on
json, sqlite, s3); a shared engine became a shared Store object. Tests of SQLAlchemy
internals (engines, table creation locks, SQL ORDER BY clauses, rowcounts) are left out.
Deliberate difference: upstream skips corrupt rows; chatstate fails loudly
(CorruptTranscriptError naming the file and position) and leaves the data untouched.
Order is the chain's ``seq``, so timestamps cannot reorder items (the tie cases hold
by construction and are asserted without rewriting timestamps, which are hash-covered).

Left out: the non-ASCII storage options (an SQLAlchemy JSON setting), test_runner_integration
(the same as test_session_memory_basic_functionality_parametrized), the SQLite fallback,
rowcount, RETURNING-retry and cancellation-during-transaction tests, the transient SQLite
write-lock test, create_tables=False lock allocation, the cancelled table-init waiter,
ORDER BY clause inspection (test_get_items_orders_by_id_for_ties), the engine property
tests, the SQLAlchemy session-settings duplicates of test_session.py's, and the engine
registry tests: all SQLAlchemy internals with no counterpart in a chatstate store.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, Runner, TResponseInputItem
from support.agents_port import get_text_message, make_session, scripted_model

from chatstate.errors import CorruptTranscriptError
from chatstate.integrations.agents import ChatstateSession
from chatstate.stores import open_store

__all__ = ["make_session"]
pytestmark = pytest.mark.asyncio


def _make_message_item(item_id: str, text_value: str) -> TResponseInputItem:
    return cast(TResponseInputItem, {
        "id": item_id, "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": text_value, "annotations": [],
                     "logprobs": []}]})


def _make_reasoning_item(item_id: str, summary_text: str) -> TResponseInputItem:
    return cast(TResponseInputItem, {
        "id": item_id, "type": "reasoning",
        "summary": [{"type": "summary_text", "text": summary_text}]})


def _item_ids(items: list[TResponseInputItem]) -> list[str]:
    return [cast(str, cast(dict[str, Any], item)["id"]) for item in items]


@pytest.fixture
def agent() -> Agent:
    return Agent(name="test", model=scripted_model())


async def test_sqlalchemy_session_direct_ops(make_session):
    session = make_session("direct_ops_test")
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
    ]
    await session.add_items(items)

    retrieved = await session.get_items()
    assert len(retrieved) == 2
    assert retrieved[0].get("content") == "Hello"
    assert retrieved[1].get("content") == "Hi there!"

    popped = await session.pop_item()
    assert popped is not None
    assert popped.get("content") == "Hi there!"
    retrieved_after_pop = await session.get_items()
    assert len(retrieved_after_pop) == 1
    assert retrieved_after_pop[0].get("content") == "Hello"

    await session.clear_session()
    retrieved_after_clear = await session.get_items()
    assert len(retrieved_after_clear) == 0
    # chatstate: pop and clear are events; both items are still in the verified chain.
    conv = session.store.load(session.session_id)
    assert [m.role for m in conv.messages] == ["user", "assistant", "event", "event"]
    assert conv.verify() is None


async def test_session_isolation(agent: Agent, make_session):
    session1 = make_session("session_1")
    session2 = make_session("session_2")
    agent.model.enqueue([get_text_message("I like cats.")])  # type: ignore[union-attr]
    await Runner.run(agent, "I like cats.", session=session1)
    agent.model.enqueue([get_text_message("I like dogs.")])  # type: ignore[union-attr]
    await Runner.run(agent, "I like dogs.", session=session2)
    agent.model.enqueue([get_text_message("You said you like cats.")])  # type: ignore[union-attr]
    result = await Runner.run(agent, "What animal did I say I like?", session=session1)
    assert "cats" in result.final_output.lower()
    assert "dogs" not in result.final_output.lower()


async def test_get_items_with_limit(make_session):
    session = make_session("limit_test")
    items: list[TResponseInputItem] = [
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "3"},
        {"role": "assistant", "content": "4"},
    ]
    await session.add_items(items)
    latest_2 = await session.get_items(limit=2)
    assert len(latest_2) == 2
    assert latest_2[0].get("content") == "3"
    assert latest_2[1].get("content") == "4"
    assert len(await session.get_items()) == 4
    assert len(await session.get_items(limit=10)) == 4


async def test_pop_from_empty_session(make_session):
    session = make_session("empty_session")
    assert await session.pop_item() is None


async def test_concurrent_pop_item_returns_each_row_once(make_session):
    writer = make_session("concurrent_pop")
    other = make_session("concurrent_pop")
    await writer.add_items([
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "second"},
    ])
    tasks = [asyncio.create_task(session.pop_item()) for session in (writer, other)]
    popped = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    contents = {cast(dict[str, Any], item)["content"] for item in popped if item is not None}
    assert contents == {"first", "second"}


def _corrupt(url: str, session_id: str) -> Path:
    """Damage the stored transcript as upstream does (a row that is not JSON); return the
    damaged file."""
    path = Path(url.split("://", 1)[1])
    if url.startswith("json://"):
        # The json store's file ends in its append log, where a cut-off last line is an
        # append a crash interrupted (ignored, never acknowledged). A whole record whose
        # checksum does not match was written by someone else: that is damage.
        target = path / f"{session_id}.json"
        row = b'{"schema":1,"at":"x","messages":["not valid json {{{"]}\t00000000\n'
        target.write_bytes(target.read_bytes() + row)
        return target
    db = sqlite3.connect(path)
    with db:
        seq = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE "
                         "conversation_id = ?", (session_id,)).fetchone()[0]
        db.execute("INSERT INTO messages (conversation_id, seq, body, hash) "
                   "VALUES (?, ?, ?, ?)", (session_id, seq, "not valid json {{{", "x"))
    db.close()
    return path


async def _corrupted(local_store_url: str, session_id: str,
                     items: list[TResponseInputItem]) -> tuple[ChatstateSession, Path, bytes]:
    session = ChatstateSession(session_id, store=local_store_url)
    if items:
        await session.add_items(items)
    else:  # upstream inserts a corrupt row into an empty session
        await session.add_items([{"role": "user", "content": "x"}])
        await session.clear_session()
    damaged = _corrupt(local_store_url, session_id)
    return session, damaged, damaged.read_bytes()


async def test_pop_item_skips_corrupt_most_recent(local_store_url):
    """chatstate: pop_item refuses (CorruptTranscriptError), writes nothing."""
    session, damaged, before = await _corrupted(
        local_store_url, "pop_corrupt", [{"role": "user", "content": "valid"}])
    with pytest.raises(CorruptTranscriptError) as info:
        await session.pop_item()
    assert "pop_corrupt" in str(info.value) or str(damaged) in str(info.value)
    assert damaged.read_bytes() == before
    session.close()


async def test_get_items_limit_skips_corrupt_newest_rows(local_store_url):
    """chatstate: get_items refuses to guess past damage (CorruptTranscriptError)."""
    session, damaged, before = await _corrupted(local_store_url, "limit_corrupt", [
        {"role": "user", "content": "valid 0"},
        {"role": "assistant", "content": "valid 1"},
        {"role": "user", "content": "valid 2"},
    ])
    with pytest.raises(CorruptTranscriptError):
        await session.get_items(limit=2)
    assert damaged.read_bytes() == before
    session.close()


async def test_get_items_limit_returns_fewer_when_history_exhausted(make_session):
    session = make_session("limit_exhausted")
    await session.add_items([{"role": "user", "content": "only valid"}])
    retrieved = await session.get_items(limit=5)
    assert [item.get("content") for item in retrieved] == ["only valid"]


async def test_pop_item_returns_none_after_dropping_only_corrupt_rows(local_store_url):
    """chatstate: nothing is dropped; pop_item raises and the damaged data stays as it is."""
    session, damaged, before = await _corrupted(local_store_url, "pop_only_corrupt", [])
    with pytest.raises(CorruptTranscriptError):
        await session.pop_item()
    with pytest.raises(CorruptTranscriptError):
        await session.get_items()
    assert damaged.read_bytes() == before
    session.close()


async def test_add_empty_items_list(make_session):
    session = make_session("add_empty_test")
    assert len(await session.get_items()) == 0
    await session.add_items([])
    assert len(await session.get_items()) == 0


async def _concurrent_first_writes(session: ChatstateSession) -> None:
    submitted = [f"msg-{i}" for i in range(25)]

    async def worker(content: str) -> None:
        await session.add_items([{"role": "user", "content": content}])

    results = await asyncio.gather(*(worker(c) for c in submitted), return_exceptions=True)
    assert [result for result in results if isinstance(result, Exception)] == []
    stored = await session.get_items()
    assert len(stored) == len(submitted)
    assert sorted(cast(str, item.get("content")) for item in stored) == sorted(submitted)


async def test_add_items_concurrent_first_access_with_create_tables(make_session):
    await _concurrent_first_writes(make_session("concurrent_first_access"))


async def test_add_items_concurrent_first_write_after_tables_exist(make_session):
    await make_session("concurrent_first_write").get_items()
    await _concurrent_first_writes(make_session("concurrent_first_write"))


async def test_add_items_concurrent_first_access_across_sessions_with_shared_engine(store_url):
    store = open_store(store_url)
    try:
        session_a = ChatstateSession("shared_engine_a", store=store)
        session_b = ChatstateSession("shared_engine_b", store=store)
        results = await asyncio.gather(
            session_a.add_items([{"role": "user", "content": "one"}]),
            session_b.add_items([{"role": "user", "content": "two"}]),
            return_exceptions=True)
        assert [result for result in results if isinstance(result, Exception)] == []
        assert [i.get("content") for i in await session_a.get_items()] == ["one"]
        assert [i.get("content") for i in await session_b.get_items()] == ["two"]
    finally:
        store.close()


async def test_add_items_concurrent_first_access_across_from_url_sessions(make_session):
    session_a = make_session("from_url_a")
    session_b = make_session("from_url_b")
    results = await asyncio.gather(
        session_a.add_items([{"role": "user", "content": "one"}]),
        session_b.add_items([{"role": "user", "content": "two"}]),
        return_exceptions=True)
    assert [result for result in results if isinstance(result, Exception)] == []
    assert [i.get("content") for i in await session_a.get_items()] == ["one"]
    assert [i.get("content") for i in await session_b.get_items()] == ["two"]


async def test_add_items_concurrent_first_access_across_from_url_sessions_cross_loop(
        make_session):
    """Two threads, each with its own event loop, one session id: neither hangs or loses."""
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    sessions = [make_session("cross_loop"), make_session("cross_loop")]

    def run(session: ChatstateSession, content: str) -> None:
        try:
            barrier.wait(timeout=30)
            asyncio.run(session.add_items([{"role": "user", "content": content}]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s, c))
               for s, c in zip(sessions, ["one", "two"], strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert not any(t.is_alive() for t in threads)
    assert sorted(i.get("content") for i in await sessions[0].get_items()) == ["one", "two"]


async def test_get_items_same_timestamp_consistent_order(make_session):
    session = make_session("same_timestamp_test")
    await session.add_items([_make_message_item("older_same_ts", "old")])
    await session.add_items([_make_reasoning_item("rs_same_ts", "..."),
                             _make_message_item("msg_same_ts", "...")])
    retrieved = await session.get_items()
    assert _item_ids(retrieved) == ["older_same_ts", "rs_same_ts", "msg_same_ts"]
    latest_two = await session.get_items(limit=2)
    assert _item_ids(latest_two) == ["rs_same_ts", "msg_same_ts"]


async def test_pop_item_same_timestamp_returns_latest(make_session):
    session = make_session("same_timestamp_pop_test")
    await session.add_items([_make_reasoning_item("rs_pop_same_ts", "..."),
                             _make_message_item("msg_pop_same_ts", "...")])
    popped = await session.pop_item()
    assert popped is not None
    assert cast(dict[str, Any], popped)["id"] == "msg_pop_same_ts"
    assert _item_ids(await session.get_items()) == ["rs_pop_same_ts"]
