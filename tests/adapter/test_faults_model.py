"""Model faults through the package's fake server over loopback, with the real session.

429 storms (Retry-After honoured, from the server's own arrival times), 5xx, an
endpoint that hangs past the read timeout, a connection cut mid-stream, and a
malformed SSE body. In every case: the user's message was durable before the
first request and is stored exactly once however many requests carried it, the
error is a ModelError that says what happened and what to do, the turn is
reported as interrupted, and ``chat.retry()`` (also from a fresh Chat, as after
a restart, and ``chatstate ask --retry`` from the CLI) completes it under the
same turn id without a second user message.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.cli_helpers import invoke

from chatstate import Chat, make_adapter, open_store
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ModelError
from chatstate.testing import FakeModel

CID = "model-faults"
KEY = "sk-model-faults-0123456789"


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=12) as server:
        yield server


def new_chat(url: str, fake: FakeModel, **adapter: Any) -> Chat:
    settings: dict[str, Any] = {"max_retries": 3, "backoff_base": 0.01, "timeout": 5.0}
    settings.update(adapter)
    return Chat(url, conversation_id=CID, adapter=make_adapter(
        base_url=fake.base_url, api_key=KEY, model="fake-model", **settings))


def run_turn(chat: Chat, text: str, stream: bool) -> tuple[Message, str]:
    """One turn; returns the reply and the text that was shown while streaming."""
    if not stream:
        return chat.send(text), ""
    shown = "".join(chat.stream(text))
    return chat.messages[-1], shown


def stored(url: str) -> list[Message]:
    store = open_store(url)
    try:
        conv: Conversation = store.load(CID)
        assert conv.verify() is None
        return conv.messages
    finally:
        store.close()


def assert_one_user_message(url: str, text: str) -> Message:
    users = [m for m in stored(url) if m.role == "user" and m.content == text]
    assert len(users) == 1, f"the user message is stored {len(users)} times"
    return users[0]


def assert_interrupted_and_kept(chat: Chat, url: str, text: str) -> Message:
    user = assert_one_user_message(url, text)
    turn = Chat(url, conversation_id=CID, adapter=chat.adapter).interrupted
    assert turn is not None, turn
    assert turn.turn_id == user.turn_id, turn
    return user


def assert_completed(url: str, user: Message, fake: FakeModel) -> None:
    """The turn ends in one complete reply of the fake's, after the one user message."""
    messages = stored(url)
    assert [m for m in messages if m.role == "user"] == [user]
    reply = messages[-1]
    assert reply.role == "assistant"
    assert reply.status == "complete"
    assert reply.turn_id == user.turn_id
    assert reply.content == fake.reply_for([user.to_openai()])


def chat_requests(fake: FakeModel) -> list[dict[str, Any]]:
    return [e for e in fake.request_log if e["path"].endswith("/chat/completions")]


@pytest.mark.invariant(1)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_429_storm_honours_retry_after_then_succeeds(local_store_url: str, fake: FakeModel,
                                                     stream: bool) -> None:
    fake.fail_next(429, times=3, retry_after=0.25)
    chat = new_chat(local_store_url, fake)
    reply, _ = run_turn(chat, "storm", stream)
    arrivals = [e["time"] for e in chat_requests(fake)]
    assert len(arrivals) == 4
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert all(g >= 0.24 for g in gaps), f"Retry-After not honoured: {gaps}"
    user = assert_one_user_message(local_store_url, "storm")
    assert reply.turn_id == user.turn_id
    assert_completed(local_store_url, user, fake)


@pytest.mark.invariant(1)
@pytest.mark.parametrize(("status", "words"), [(429, "rate limiting"),
                                               (503, "provider is failing"),
                                               (500, "provider is failing")])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_errors_outlasting_retries_keep_the_turn(local_store_url: str, fake: FakeModel,
                                                 status: int, words: str, stream: bool) -> None:
    fake.fail_next(status, times=50, retry_after=0.01 if status == 429 else None)
    chat = new_chat(local_store_url, fake, max_retries=2)
    with pytest.raises(ModelError) as info:
        run_turn(chat, "doomed", stream)
    text = str(info.value)
    assert f"HTTP {status}" in text, text
    assert "after 3 attempts" in text, text
    assert words in text, text
    assert fake.base_url in text
    assert KEY not in text
    assert info.value.status == status
    assert info.value.retryable
    assert len(chat_requests(fake)) == 3
    user = assert_interrupted_and_kept(chat, local_store_url, "doomed")
    fake.reset()
    if stream:
        assert "".join(chat.retry_stream()) == chat.messages[-1].content
    else:
        chat.retry()
    assert_completed(local_store_url, user, fake)


@pytest.mark.invariant(1, 7)
def test_retry_after_a_restart_completes_the_turn_once(local_store_url: str,
                                                       fake: FakeModel) -> None:
    fake.fail_next(503, times=50)
    with pytest.raises(ModelError):
        new_chat(local_store_url, fake, max_retries=1).send("before the restart")
    fake.reset()
    fresh = new_chat(local_store_url, fake)  # a new process would see exactly this
    user = assert_one_user_message(local_store_url, "before the restart")
    assert fresh.interrupted is not None
    assert fresh.interrupted.turn_id == user.turn_id
    fresh.retry()
    assert_completed(local_store_url, user, fake)
    assert new_chat(local_store_url, fake).interrupted is None


@pytest.mark.invariant(1)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_hanging_endpoint_times_out_clearly(local_store_url: str, fake: FakeModel,
                                            stream: bool) -> None:
    fake.hang_next(60.0)
    chat = new_chat(local_store_url, fake, max_retries=0, timeout=0.5)
    started = time.monotonic()
    with pytest.raises(ModelError) as info:
        run_turn(chat, "anyone there?", stream)
    assert time.monotonic() - started < 20, "the timeout did not fire"  # the hang is 60 s
    assert "did not answer within 0.5s" in str(info.value), str(info.value)
    user = assert_interrupted_and_kept(chat, local_store_url, "anyone there?")
    chat.retry()
    assert_completed(local_store_url, user, fake)


def test_hang_once_is_retried_inside_the_turn(local_store_url: str, fake: FakeModel) -> None:
    fake.hang_next(10.0)
    chat = new_chat(local_store_url, fake, max_retries=1, timeout=0.5)
    chat.send("slow")
    assert len(chat_requests(fake)) == 2
    assert_completed(local_store_url, assert_one_user_message(local_store_url, "slow"), fake)


def test_stream_cut_once_resumes_without_a_seam(local_store_url: str, fake: FakeModel) -> None:
    """A cut the adapter's retry recovers from: one complete reply, shown exactly once."""
    fake.cut_stream_next(after_chunks=3)
    chat = new_chat(local_store_url, fake)
    reply, shown = run_turn(chat, "cut once", stream=True)
    assert shown == reply.content
    assert len(chat_requests(fake)) == 2
    assert_completed(local_store_url, assert_one_user_message(local_store_url, "cut once"), fake)
    assert all(m.status == "complete" for m in stored(local_store_url))


@pytest.mark.invariant(2)
@pytest.mark.parametrize("clean", [False, True], ids=["dropped", "no-finish"])
def test_stream_cut_for_good_keeps_the_partial(local_store_url: str, fake: FakeModel,
                                               clean: bool) -> None:
    fake.cut_stream_next(after_chunks=3, times=50, clean=clean)
    chat = new_chat(local_store_url, fake, max_retries=1)
    shown = ""
    with pytest.raises(ModelError) as info:
        for delta in chat.stream("cut for good"):
            shown += delta
    assert shown, str(info.value)
    assert "cut after" in str(info.value), str(info.value)
    user = assert_interrupted_and_kept(chat, local_store_url, "cut for good")
    store = open_store(local_store_url)
    partial = store.load(CID).partial
    store.close()
    assert partial is not None
    assert partial.content.startswith(shown)  # shown => stored
    fake.reset()
    chat.retry()
    messages = stored(local_store_url)
    assert [m.status for m in messages[-2:]] == ["partial", "complete"]
    assert messages[-2].content == partial.content
    assert messages[-2].turn_id == user.turn_id
    assert_completed(local_store_url, user, fake)


@pytest.mark.invariant(1)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_malformed_reply_is_not_retried_and_keeps_the_turn(local_store_url: str,
                                                           fake: FakeModel,
                                                           stream: bool) -> None:
    fake.malformed_next()
    chat = new_chat(local_store_url, fake)
    with pytest.raises(ModelError) as info:
        run_turn(chat, "garbled", stream)
    assert "not OpenAI-compatible" in str(info.value), str(info.value)
    assert len(chat_requests(fake)) == 1  # waiting would not fix a broken proxy
    user = assert_interrupted_and_kept(chat, local_store_url, "garbled")
    chat.retry()
    assert_completed(local_store_url, user, fake)


@pytest.mark.invariant(1)
def test_cli_ask_storm_then_retry(local_store_url: str, fake: FakeModel) -> None:
    """Through ``chatstate ask``: exit 1 with one paragraph and the retry hint; ``--retry``
    completes the turn; the prompt is stored once."""
    env = {"CHATSTATE_API_KEY": KEY, "CHATSTATE_MAX_RETRIES": "1",
           "CHATSTATE_BACKOFF_BASE": "0.01"}
    fake.fail_next(429, times=50, retry_after=0.01)
    failed = invoke(["ask", "--base-url", fake.base_url, "--id", CID, "via the cli"],
                    store=local_store_url, env=env)
    assert failed.code == 1, failed
    errors = [line for line in failed.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, failed.err
    assert "HTTP 429" in errors[0], failed.err
    assert "--retry" in errors[0], failed.err
    assert "Traceback" not in failed.err
    assert KEY not in failed.err + failed.out
    fake.reset()
    done = invoke(["ask", "--base-url", fake.base_url, "--id", CID, "--retry"],
                  store=local_store_url, env=env)
    assert done.code == 0, done.err
    user = assert_one_user_message(local_store_url, "via the cli")
    assert_completed(local_store_url, user, fake)
    assert done.out.strip() == stored(local_store_url)[-1].content
