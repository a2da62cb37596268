"""AsyncChat over real HTTP to the fake model: the same guarantees as Chat, from asyncio.

A cancelled consumer task must leave the partial reply stored (everything it
was given, at least), and the turn must be retryable from a fresh open.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from chatstate import AsyncChat, Conversation, ModelError, make_adapter, open_store
from chatstate.testing import FakeModel

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=20, chunk_delay=0.01) as model:  # slower than the disk
        yield model


@pytest.fixture
def url(local_store_url: str) -> str:
    return local_store_url


def adapter(fake: FakeModel, retries: int = 3) -> Any:
    return make_adapter(base_url=fake.base_url, api_key="test-key", model="fake-model",
                        max_retries=retries, backoff_base=0.001)


def fresh(url: str, cid: str) -> Conversation:
    s = open_store(url)
    try:
        conv: Conversation = s.load(cid)
    finally:
        s.close()
    assert conv.verify() is None
    return conv


def roles(conv: Conversation) -> list[tuple[str, str]]:
    return [(m.role, m.status) for m in conv.messages]


def test_send_and_stream(url: str, fake: FakeModel) -> None:
    async def main() -> tuple[str, str, list[str]]:
        chat = await AsyncChat.open(url, adapter=adapter(fake), system="Be brief.")
        reply = await chat.send("hello", temperature=0.3)
        deltas = [d async for d in chat.stream("and then?")]
        return chat.id, reply.content, deltas

    cid, first, deltas = asyncio.run(main())
    conv = fresh(url, cid)
    assert roles(conv) == [("system", "complete")] + [("user", "complete"),
                                                      ("assistant", "complete")] * 2
    assert conv.messages[2].content == first
    assert len(deltas) > 5
    assert "".join(deltas) == conv.messages[4].content
    assert conv.messages[1].params == {"temperature": 0.3}
    requests = [e for e in fake.request_log if e["path"] == "/v1/chat/completions"]
    assert [r["stream"] for r in requests] == [False, True]
    assert len(requests[1]["messages"]) == 4  # the whole history went with the second turn


@pytest.mark.invariant(2)
def test_cancelled_consumer_stores_the_partial_and_the_turn_can_be_retried(
        url: str, fake: FakeModel) -> None:
    fake.configure(chunk_delay=0.02)

    async def main() -> tuple[str, str]:
        chat = await AsyncChat.open(url, adapter=adapter(fake))
        shown: list[str] = []
        three = asyncio.Event()

        async def consume() -> None:
            async for delta in chat.stream("tell me a story"):
                shown.append(delta)
                if len(shown) == 3:
                    three.set()

        task = asyncio.create_task(consume())
        await three.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return chat.id, "".join(shown)

    cid, shown = asyncio.run(main())
    conv = fresh(url, cid)
    assert conv.partial is not None
    assert conv.partial.content.startswith(shown)
    assert roles(conv) == [("user", "complete")]

    async def resume() -> str:
        chat = await AsyncChat.open(url, conversation_id=cid, adapter=adapter(fake))
        assert chat.interrupted is not None
        assert chat.interrupted.partial == conv.partial
        return "".join([d async for d in chat.retry_stream()])

    text = asyncio.run(resume())
    after = fresh(url, cid)
    assert roles(after) == [("user", "complete"), ("assistant", "partial"),
                            ("assistant", "complete")]
    assert after.messages[1].content == conv.partial.content
    assert after.messages[2].content == text


@pytest.mark.invariant(2)
def test_breaking_out_of_the_loop_stores_what_was_shown(url: str, fake: FakeModel) -> None:
    async def main() -> tuple[str, str]:
        chat = await AsyncChat.open(url, adapter=adapter(fake))
        shown = ""
        async with contextlib.aclosing(chat.stream("hi")) as stream:
            async for delta in stream:
                shown += delta
                if len(shown) > 10:
                    break
        return chat.id, shown

    cid, shown = asyncio.run(main())
    conv = fresh(url, cid)
    assert conv.partial is not None
    assert conv.partial.content.startswith(shown)


@pytest.mark.invariant(1)
def test_model_failure_then_retry(url: str, fake: FakeModel) -> None:
    fake.fail_next(503, times=2, retry_after=0)

    async def main() -> str:
        chat = await AsyncChat.open(url, adapter=adapter(fake, retries=1))
        with pytest.raises(ModelError):
            await chat.send("hello")
        turn = chat.interrupted
        assert turn is not None
        assert turn.user_message is not None
        reply = await chat.retry()
        assert reply.turn_id == turn.turn_id
        return chat.id

    conv = fresh(url, asyncio.run(main()))
    assert roles(conv) == [("user", "complete"), ("assistant", "complete")]


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_concurrent_conversations_on_one_store(tmp_path: Any, fake: FakeModel,
                                               kind: str) -> None:
    """asyncio's point: several conversations at once, over one opened store."""
    fake.configure(chunk_delay=0.005)
    url = f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    store = open_store(url)

    async def talk(chat: AsyncChat, name: str) -> None:
        for n in range(4):
            await chat.send(f"{name} asks {n}")
            [d async for d in chat.stream(f"{name} streams {n}")]

    async def main() -> list[str]:
        chats = [await AsyncChat.open(store, adapter=adapter(fake)) for _ in range(4)]
        await asyncio.gather(*(talk(chat, f"chat{i}") for i, chat in enumerate(chats)))
        return [chat.id for chat in chats]

    try:
        ids = asyncio.run(main())
    finally:
        store.close()
    for cid in ids:
        conv = fresh(url, cid)
        assert roles(conv) == [("user", "complete"), ("assistant", "complete")] * 8
