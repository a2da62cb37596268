"""Group commit: a slow disk coalesces deltas, it does not throttle the stream.

The store is real; a wrapper delays its partial-reply writes (the slow disk),
and the fake model streams over real HTTP.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest

from chatstate import AsyncChat, Chat, make_adapter, open_store
from chatstate.session.stream_flush import GroupCommit
from chatstate.testing import FakeModel

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")

WRITE_DELAY = 0.03  # one partial write on a slow disk
CHUNK_DELAY = 0.004  # the stream: much faster than the disk
WORDS = 60


class SlowStore:
    """A real store whose partial-reply writes take WRITE_DELAY longer; it records
    what was stored at each write."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.writes: list[str] = []

    def save_partial(self, conversation_id: str, partial: Any, *,
                     fence: str | None = None) -> None:
        time.sleep(WRITE_DELAY)
        self.inner.save_partial(conversation_id, partial, fence=fence)
        self.writes.append(partial.content)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=WORDS, chunk_delay=CHUNK_DELAY) as model:
        yield model


def make_chat(url: str, fake: FakeModel, **kwargs: Any) -> tuple[Chat, SlowStore]:
    store = SlowStore(open_store(url))
    adapter = make_adapter(base_url=fake.base_url, api_key="k", model="fake-model")
    return Chat(store, adapter=adapter, **kwargs), store


@pytest.mark.invariant(2)
def test_slow_writes_are_coalesced_and_every_shown_text_was_stored_first(
        local_store_url: str, fake: FakeModel) -> None:
    chat, store = make_chat(local_store_url, fake)
    shown, yields = "", 0
    started = time.monotonic()
    for delta in chat.stream("a long answer"):
        shown += delta
        yields += 1
        assert (store.writes and store.writes[-1] == shown) or shown == chat.messages[-1].content
    elapsed = time.monotonic() - started
    reply = chat.messages[-1]
    assert reply.status == "complete"
    assert shown == reply.content
    chunks = WORDS + 3
    # one write per delta would take chunks × WRITE_DELAY; coalesced it is far fewer
    assert len(store.writes) < chunks / 2
    assert elapsed < chunks * WRITE_DELAY * 0.75
    assert yields <= len(store.writes) + 1
    # the writes grow: each carries all that arrived during the one before
    assert all(b.startswith(a) and len(b) > len(a) for a, b in pairwise(store.writes))


@pytest.mark.invariant(2)
def test_async_chat_coalesces_too(local_store_url: str, fake: FakeModel) -> None:
    chat, store = make_chat(local_store_url, fake)

    async def run() -> str:
        shown = ""
        async for delta in AsyncChat(chat).stream("a long answer"):
            shown += delta
            assert store.writes[-1] == shown or shown == chat.messages[-1].content
        return shown

    assert asyncio.run(run()) == chat.messages[-1].content
    assert 1 <= len(store.writes) < (WORDS + 3) / 2


@pytest.mark.invariant(2)
def test_interrupt_during_a_slow_write_keeps_all_that_arrived(local_store_url: str,
                                                              fake: FakeModel) -> None:
    chat, _store = make_chat(local_store_url, fake)
    gen = chat.stream("a long answer")
    shown = next(gen) + next(gen)
    time.sleep(0.1)  # more arrives while nobody reads
    gen.close()
    partial = open_store(local_store_url).load(chat.id).partial
    assert partial is not None
    assert partial.content.startswith(shown)
    assert len(partial.content) > len(shown)  # what arrived since was kept too


# -- the feed itself, without a store ------------------------------------------------------

def events(items: list[object], fail: BaseException | None = None,
           gate: threading.Event | None = None) -> Iterator[object]:
    yield from items
    if gate is not None:
        gate.wait(5)
    if fail is not None:
        raise fail


def test_text_that_arrived_before_an_error_is_handed_out_before_the_error() -> None:
    feed = GroupCommit(events(["a", "b", "c"], fail=RuntimeError("cut")))
    got = []
    with pytest.raises(RuntimeError, match="cut"):
        for item in feed:
            got.append(item)
    assert got
    assert got[-1] == "abc"
    assert feed.arrived() == "abc"


def test_the_final_event_ends_the_feed_after_the_text() -> None:
    final = object()
    feed = GroupCommit(events(["x", "y", final]))
    items = list(feed)
    assert items[-1] is final
    assert items[-2] == "xy"


def test_the_ceiling_holds_text_back_and_the_final_event_carries_it() -> None:
    final, gate = object(), threading.Event()
    feed = GroupCommit(events(["x", "y", final]), ceiling=60)
    assert next(feed) is final  # "xy" waited for the ceiling; the commit carries it
    assert feed.arrived() == "xy"
    gate.set()


def test_with_a_ceiling_text_is_released_once_it_has_passed() -> None:
    gate = threading.Event()
    feed = GroupCommit(events(["x", "y"], gate=gate), ceiling=0.2)
    started = time.monotonic()
    assert next(feed) == "xy"
    assert time.monotonic() - started >= 0.15
    gate.set()
    with pytest.raises(StopIteration):
        next(feed)
