"""Chat over real HTTP to the fake model, on the json and sqlite stores.

Each test drives a turn through a failure the fake model produces on demand
(429, 5xx, a cut stream, a consumer that stops reading, a second writer) and
then reads the store back through a fresh ``open_store``: what the session
promised durable is there, once, in a chain that verifies, and what the model
was sent is in the fake's request log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chatstate import (
    Chat,
    ChatstateError,
    ConflictError,
    Conversation,
    ConversationInUse,
    ModelError,
    make_adapter,
    open_store,
)
from chatstate.testing import FakeModel

SYSTEM = "You are terse."


pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    # A stream slower than the disk, so each delta is written and yielded on its own;
    # a faster one is coalesced into fewer writes (group commit, test_group_commit.py).
    with FakeModel(reply_words=12, chunk_delay=0.01) as model:
        yield model


@pytest.fixture
def url(local_store_url: str) -> str:
    return local_store_url


@pytest.fixture
def store(url: str) -> Iterator[Any]:
    s = open_store(url)
    try:
        yield s
    finally:
        s.close()


def adapter(fake: FakeModel, *, retries: int = 3) -> Any:
    return make_adapter(base_url=fake.base_url, api_key="test-key", model="fake-model",
                        max_retries=retries, backoff_base=0.001)


def chat_for(store: Any, fake: FakeModel, *, retries: int = 3, **kwargs: Any) -> Chat:
    return Chat(store, adapter=adapter(fake, retries=retries), **kwargs)


def fresh(url: str, cid: str) -> Conversation:
    """The conversation as a new process would see it."""
    s = open_store(url)
    try:
        conv: Conversation = s.load(cid)
    finally:
        s.close()
    assert conv.verify() is None
    return conv


def chat_requests(fake: FakeModel) -> list[dict[str, Any]]:
    return [e for e in fake.request_log if e["path"] == "/v1/chat/completions"]


def roles(conv: Conversation) -> list[tuple[str, str]]:
    return [(m.role, m.status) for m in conv.messages]


def wire(conv: Conversation) -> list[dict[str, str]]:
    """The history a request for the next reply must carry: complete messages only."""
    return [m.to_openai() for m in conv.messages if m.status == "complete"]


# -- plain and streamed turns -------------------------------------------------------------

def test_plain_turn_is_stored_with_params_model_and_usage(url: str, store: Any,
                                                          fake: FakeModel) -> None:
    chat = chat_for(store, fake, system=SYSTEM)
    reply = chat.send("hello there", temperature=0.25, max_tokens=5)

    conv = fresh(url, chat.id)
    system, user, stored = conv.messages
    assert (system.seq, system.role, system.content) == (0, "system", SYSTEM)
    assert (user.role, user.content) == ("user", "hello there")
    assert user.params == {"temperature": 0.25, "max_tokens": 5}
    assert stored == reply
    assert stored.role == "assistant"
    assert stored.status == "complete"
    assert stored.turn_id == user.turn_id != system.turn_id
    assert stored.model == "fake-model"
    assert stored.usage is not None
    assert stored.usage["completion_tokens"] == 5
    assert conv.partial is None
    assert chat.interrupted is None

    (request,) = chat_requests(fake)
    assert request["body"]["temperature"] == 0.25
    assert request["body"]["max_tokens"] == 5
    assert request["stream"] is False
    assert request["messages"] == [{"role": "system", "content": SYSTEM},
                                   {"role": "user", "content": "hello there"}]
    assert reply.content == fake.reply_for(request["messages"], max_tokens=5)
    assert conv.title == "hello there"  # the first message names the conversation


def test_streamed_turn_yields_the_stored_reply(url: str, store: Any, fake: FakeModel) -> None:
    chat = chat_for(store, fake, system=SYSTEM)
    chat.send("first")
    deltas = list(chat.stream("second", temperature=0.5))

    conv = fresh(url, chat.id)
    assert roles(conv) == [("system", "complete")] + [("user", "complete"),
                                                      ("assistant", "complete")] * 2
    reply = conv.messages[-1]
    assert len(deltas) > 5
    assert "".join(deltas) == reply.content
    assert reply.model == "fake-model"
    assert reply.usage
    assert reply.usage["total_tokens"] > 0
    assert conv.messages[-2].params == {"temperature": 0.5}

    last = chat_requests(fake)[-1]
    assert last["stream"] is True
    assert last["body"]["temperature"] == 0.5
    assert last["messages"] == wire(conv)[:-1]  # the whole history, not just the new message
    assert reply.content == fake.reply_for(last["messages"])


def test_default_params_merge_with_per_call_params(url: str, store: Any,
                                                   fake: FakeModel) -> None:
    chat = chat_for(store, fake, params={"temperature": 0.1, "max_tokens": 50})
    chat.send("hi", max_tokens=3)
    assert fresh(url, chat.id).messages[0].params == {"temperature": 0.1, "max_tokens": 3}
    body = chat_requests(fake)[-1]["body"]
    assert (body["temperature"], body["max_tokens"]) == (0.1, 3)


def test_per_call_model_is_sent_and_the_chain_still_verifies(url: str, store: Any,
                                                             fake: FakeModel) -> None:
    chat = chat_for(store, fake)
    reply = chat.send("hi", model="other-model")
    assert chat_requests(fake)[-1]["model"] == "other-model"
    assert reply.model == "other-model"
    assert chat.conversation.verify() is None  # the in-memory copy was not altered
    assert fresh(url, chat.id).messages == chat.messages


def test_add_system_and_set_title(url: str, store: Any, fake: FakeModel) -> None:
    chat = chat_for(store, fake, title="Support")
    chat.send("one")
    chat.add_system("From now on, answer in French.")
    chat.set_title("Support (fr)")
    chat.send("two")
    conv = fresh(url, chat.id)
    assert conv.title == "Support (fr)"
    assert [m.role for m in conv.messages] == ["user", "assistant", "system", "user",
                                               "assistant"]
    assert chat_requests(fake)[-1]["messages"][2] == {
        "role": "system", "content": "From now on, answer in French."}


# -- model failures ----------------------------------------------------------------------

@pytest.mark.invariant(10)
@pytest.mark.parametrize("streamed", [False, True])
def test_429_then_success_stores_one_user_message_and_one_reply(
        url: str, store: Any, fake: FakeModel, streamed: bool) -> None:
    chat = chat_for(store, fake, system=SYSTEM)
    chat.send("first")
    fake.fail_next(429, times=2, retry_after=0)
    if streamed:
        "".join(chat.stream("second"))
    else:
        chat.send("second")

    conv = fresh(url, chat.id)
    assert [m.content for m in conv.messages if m.role == "user"] == ["first", "second"]
    assert roles(conv)[1:] == [("user", "complete"), ("assistant", "complete")] * 2
    requests = chat_requests(fake)[1:]
    assert [r["status"] for r in requests] == [429, 429, 200]
    for request in requests:  # each retry re-sent the whole history, unchanged
        assert request["messages"] == wire(conv)[:-1]


@pytest.mark.invariant(1, 7)
@pytest.mark.parametrize("streamed", [False, True])
def test_5xx_until_retries_run_out_leaves_an_interrupted_turn_retry_completes(
        url: str, store: Any, fake: FakeModel, streamed: bool) -> None:
    chat = chat_for(store, fake, retries=2)
    chat.send("first")
    fake.fail_next(503, times=3, retry_after=0)  # the first try and both retries
    with pytest.raises(ModelError) as failure:
        if streamed:
            list(chat.stream("second"))
        else:
            chat.send("second")
    assert failure.value.status == 503
    assert "503" in str(failure.value)

    conv = fresh(url, chat.id)
    user = conv.messages[-1]
    assert (user.role, user.content) == ("user", "second")
    assert chat.interrupted is not None
    assert chat.interrupted.turn_id == user.turn_id
    reopened = chat_for(store, fake, conversation_id=chat.id)
    turn = reopened.interrupted
    assert turn is not None
    assert turn.turn_id == user.turn_id
    assert turn.partial is None
    assert turn.user_message == user
    assert "no reply" in turn.describe()

    if streamed:
        text = "".join(reopened.retry_stream())
        reply = reopened.messages[-1]
        assert text == reply.content
    else:
        reply = reopened.retry()
    conv = fresh(url, chat.id)
    assert [m.content for m in conv.messages if m.role == "user"] == ["first", "second"]
    assert conv.messages[-1] == reply
    assert reply.turn_id == user.turn_id
    assert reply.seq == user.seq + 1
    assert reopened.interrupted is None
    requests = chat_requests(fake)[1:]
    assert [r["status"] for r in requests] == [503, 503, 503, 200]
    for request in requests:
        assert request["messages"] == wire(conv)[:-1]


def test_retry_without_an_interrupted_turn_is_an_error(store: Any, fake: FakeModel) -> None:
    chat = chat_for(store, fake)
    chat.send("hi")
    with pytest.raises(ChatstateError, match="no interrupted turn"):
        chat.retry()


def test_a_single_cut_is_retried_without_repeating_a_character(url: str, store: Any,
                                                               fake: FakeModel) -> None:
    chat = chat_for(store, fake)
    fake.cut_stream_next(after_chunks=3)
    deltas = list(chat.stream("tell me"))
    conv = fresh(url, chat.id)
    assert "".join(deltas) == conv.messages[-1].content
    assert roles(conv) == [("user", "complete"), ("assistant", "complete")]
    assert [r["behaviour"] for r in chat_requests(fake)] == ["cut", "ok"]


@pytest.mark.invariant(2, 7)
def test_cut_stream_keeps_a_partial_that_covers_every_delta_retry_completes(
        url: str, store: Any, fake: FakeModel) -> None:
    chat = chat_for(store, fake, retries=0)  # the cut is final: the turn really fails
    chat.send("first")
    fake.cut_stream_next(after_chunks=4)
    shown = ""
    with pytest.raises(ModelError, match=r"cut|dropped"):
        for delta in chat.stream("second"):
            shown += delta
            partial = fresh(url, chat.id).partial
            assert partial is not None
            assert partial.content.startswith(shown)
    assert shown  # four chunks arrived before the cut

    conv = fresh(url, chat.id)
    user = conv.messages[-1]
    assert conv.partial is not None
    assert conv.partial.content.startswith(shown)
    assert conv.partial.turn_id == user.turn_id
    assert conv.partial.status == "partial"

    reopened = chat_for(store, fake, conversation_id=chat.id)
    turn = reopened.interrupted
    assert turn is not None
    assert turn.turn_id == user.turn_id
    assert turn.partial is not None
    assert turn.partial.content == conv.partial.content
    assert "cut off" in turn.describe()
    reply = reopened.retry()

    conv_after = fresh(url, chat.id)
    assert conv_after.partial is None
    assert reopened.interrupted is None
    tail = conv_after.messages[user.seq:]
    assert [(m.role, m.status) for m in tail] == [("user", "complete"),
                                                 ("assistant", "partial"),
                                                 ("assistant", "complete")]
    assert tail[1].content == conv.partial.content  # kept, visibly, as it was
    assert tail[2] == reply
    assert {m.turn_id for m in tail} == {user.turn_id}
    assert [m.content for m in conv_after.messages if m.role == "user"] == ["first", "second"]
    # The model is never shown its own cut-off words as if they were final.
    assert chat_requests(fake)[-1]["messages"] == wire(conv_after)[:-1]


# -- the consumer stops reading -----------------------------------------------------------

@pytest.mark.invariant(2, 7)
@pytest.mark.parametrize("how", ["raise", "throw", "close"])
def test_consumer_interrupt_keeps_everything_yielded(url: str, store: Any, fake: FakeModel,
                                                     how: str) -> None:
    chat = chat_for(store, fake)
    gen = chat.stream("tell me a story")
    shown = ""
    if how == "raise":  # Ctrl-C lands in the caller's loop body
        with pytest.raises(KeyboardInterrupt):
            for delta in gen:
                shown += delta
                if len(shown) > 15:
                    raise KeyboardInterrupt
    else:
        for _ in range(4):
            shown += next(gen)
        if how == "throw":  # Ctrl-C lands inside the generator
            with pytest.raises(KeyboardInterrupt):
                gen.throw(KeyboardInterrupt)
        else:
            gen.close()
    conv = fresh(url, chat.id)
    assert conv.partial is not None
    assert conv.partial.content.startswith(shown)
    if how == "raise":  # the generator was left open: closing it keeps what arrived since
        gen.close()
        conv = fresh(url, chat.id)
        assert conv.partial is not None
        assert conv.partial.content.startswith(shown)
    gen.close()
    assert fresh(url, chat.id).partial == conv.partial  # closing later changes nothing

    reopened = chat_for(store, fake, conversation_id=chat.id)
    assert reopened.interrupted is not None
    assert reopened.interrupted.partial == conv.partial
    reopened.retry()
    assert roles(fresh(url, chat.id)) == [("user", "complete"), ("assistant", "partial"),
                                          ("assistant", "complete")]


@pytest.mark.invariant(2)
def test_stream_left_before_its_completion_is_an_interrupted_turn(
        url: str, store: Any, fake: FakeModel) -> None:
    """Every delta read, but the generator closed before it finished: not complete."""
    chat = chat_for(store, fake)
    gen = chat.stream("hi")
    expected = fake.reply_for([{"role": "user", "content": "hi"}])
    shown = ""
    while shown != expected:
        shown += next(gen)
    gen.close()
    conv = fresh(url, chat.id)
    assert conv.partial is not None
    assert conv.partial.content == expected
    assert chat_for(store, fake, conversation_id=chat.id).interrupted is not None


def test_new_turn_after_an_interrupted_one_keeps_the_partial(url: str, store: Any,
                                                             fake: FakeModel) -> None:
    chat = chat_for(store, fake)
    gen = chat.stream("one")
    shown = next(gen) + next(gen)
    gen.close()
    chat.send("two")
    conv = fresh(url, chat.id)
    assert roles(conv) == [("user", "complete"), ("assistant", "partial"),
                           ("user", "complete"), ("assistant", "complete")]
    assert conv.messages[1].content.startswith(shown)
    # the unanswered turn is kept but not sent: the model sees user/assistant alternate
    assert chat_requests(fake)[-1]["messages"] == [{"role": "user", "content": "two"}]


class CtrlC:
    """Deliver a real SIGALRM after ``seconds`` whose handler raises KeyboardInterrupt,
    as Ctrl-C would, wherever the main thread happens to be (here: waiting on the model)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self) -> None:
        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        self.previous = signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


@pytest.mark.invariant(1, 7)
def test_ctrl_c_while_waiting_for_a_plain_reply_keeps_the_question(
        url: str, store: Any, fake: FakeModel) -> None:
    chat = chat_for(store, fake)
    fake.hang_next(5)
    with CtrlC(0.3), pytest.raises(KeyboardInterrupt):
        chat.send("are you there?")
    conv = fresh(url, chat.id)
    assert roles(conv) == [("user", "complete")]
    assert conv.partial is None
    reopened = chat_for(store, fake, conversation_id=chat.id)
    assert reopened.interrupted is not None
    assert reopened.retry().turn_id == conv.messages[0].turn_id


@pytest.mark.invariant(2)
def test_ctrl_c_mid_stream_stores_what_arrived_but_was_not_yet_flushed(
        url: str, store: Any, fake: FakeModel) -> None:
    fake.configure(chunk_delay=0.05, reply_words=40)
    chat = chat_for(store, fake, flush_interval=60)  # nothing is flushed, nothing yielded
    gen = chat.stream("a long one")
    with CtrlC(0.4), pytest.raises(KeyboardInterrupt):
        next(gen)
    conv = fresh(url, chat.id)
    assert conv.partial is not None
    assert len(conv.partial.content.split()) >= 3
    expected = fake.reply_for([{"role": "user", "content": "a long one"}])
    assert expected.startswith(conv.partial.content)


# -- the flush window ---------------------------------------------------------------------

class CountingStore:
    """A real store that counts how often the session writes the partial reply."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.partial_writes = 0

    def save_partial(self, conversation_id: str, partial: Any, *,
                     fence: str | None = None) -> None:
        self.partial_writes += 1
        self.inner.save_partial(conversation_id, partial, fence=fence)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def stored_reply(conv: Conversation) -> str:
    if conv.partial is not None:
        return conv.partial.content
    last = conv.messages[-1]
    return last.content if last.role == "assistant" else ""


@pytest.mark.invariant(2)
def test_flush_window_coalesces_writes_and_yields_only_stored_text(url: str, store: Any,
                                                                   fake: FakeModel) -> None:
    fake.configure(chunk_delay=0.02, reply_words=30)
    counting = CountingStore(store)
    chat = chat_for(counting, fake, flush_interval=0.2)
    shown, yields = "", 0
    for delta in chat.stream("a long answer, please"):
        shown += delta
        yields += 1
        assert stored_reply(fresh(url, chat.id)).startswith(shown)
    request = chat_requests(fake)[-1]
    chunks = len(fake.reply_for(request["messages"]).split())
    reply = fresh(url, chat.id).messages[-1]
    assert shown == reply.content
    assert reply.status == "complete"
    assert 1 <= counting.partial_writes < chunks  # ~0.7 s of stream: about one write per 0.2 s
    assert yields <= counting.partial_writes + 1


@pytest.mark.invariant(2)
def test_without_a_flush_window_every_delta_is_written_before_it_is_yielded(
        url: str, store: Any, fake: FakeModel) -> None:
    counting = CountingStore(store)
    chat = chat_for(counting, fake)
    shown, yields = "", 0
    for delta in chat.stream("hi"):
        shown += delta
        yields += 1
        partial = fresh(url, chat.id).partial
        assert partial is not None
        assert partial.content == shown
    assert counting.partial_writes == yields


def test_closing_after_the_final_delta_of_a_coalesced_stream_leaves_no_partial(
        url: str, store: Any, fake: FakeModel) -> None:
    """With a flush window the last delta comes after the reply is committed."""
    chat = chat_for(store, fake, flush_interval=60)
    gen = chat.stream("hi")
    shown = next(gen)  # nothing was flushed early: this is the whole committed reply
    gen.close()
    conv = fresh(url, chat.id)
    assert roles(conv) == [("user", "complete"), ("assistant", "complete")]
    assert conv.messages[-1].content == shown
    assert conv.partial is None
    assert chat.interrupted is None
    assert chat_for(store, fake, conversation_id=chat.id).interrupted is None


# -- two writers on one conversation -------------------------------------------------------

def test_second_writer_goes_after_a_complete_turn(url: str, store: Any,
                                                  fake: FakeModel) -> None:
    first = chat_for(store, fake, conversation_id="shared")
    first.send("a1")
    second = chat_for(store, fake, conversation_id="shared")
    first.send("a2")
    second.send("b1")  # its view is stale: it reloads and goes after a2's whole turn

    conv = fresh(url, "shared")
    assert [m.content for m in conv.messages if m.role == "user"] == ["a1", "a2", "b1"]
    assert roles(conv) == [("user", "complete"), ("assistant", "complete")] * 3
    assert second.messages == conv.messages
    assert chat_requests(fake)[-1]["messages"] == wire(conv)[:-1]


LOADS = ["before the conversation exists", "after its first turn"]


@pytest.mark.invariant(5)
@pytest.mark.parametrize("loads", LOADS)
def test_second_writer_refuses_to_split_a_failed_turn(url: str, store: Any, fake: FakeModel,
                                                      loads: str) -> None:
    first = chat_for(store, fake, conversation_id="shared", retries=0)
    early = chat_for(store, fake, conversation_id="shared") if loads == LOADS[0] else None
    first.send("a1")
    second = early or chat_for(store, fake, conversation_id="shared")
    fake.fail_next(500)
    with pytest.raises(ModelError):
        first.send("a2")
    before = fresh(url, "shared")
    with pytest.raises(ConflictError):
        second.send("b1")
    assert fresh(url, "shared").messages == before.messages  # nothing of b1 was written
    first.retry()
    second.send("b1")  # the turn is whole now
    conv = fresh(url, "shared")
    assert [m.content for m in conv.messages if m.role == "user"] == ["a1", "a2", "b1"]
    assert roles(conv) == [("user", "complete"), ("assistant", "complete")] * 3


@pytest.mark.invariant(5)
@pytest.mark.parametrize("loads", LOADS)
def test_second_writer_refuses_while_the_first_is_streaming(url: str, store: Any,
                                                            fake: FakeModel, loads: str) -> None:
    first = chat_for(store, fake, conversation_id="shared")
    if loads == LOADS[1]:
        first.send("a0")
    second = chat_for(store, fake, conversation_id="shared")  # loaded before the turn
    gen = first.stream("a1")
    shown = next(gen) + next(gen)
    with pytest.raises(ConflictError):
        second.send("b1")
    shown += "".join(gen)
    conv = fresh(url, "shared")
    assert roles(conv)[-2:] == [("user", "complete"), ("assistant", "complete")]
    assert len(conv.messages) == (2 if loads == LOADS[0] else 4)
    assert conv.messages[-1].content == shown


@pytest.mark.invariant(2, 5)
def test_writer_that_loaded_mid_stream_never_drops_text_already_shown(
        url: str, store: Any, fake: FakeModel) -> None:
    """The second writer saw an early partial; the first has streamed (and shown) more since.

    The second writer must not commit its stale copy of the partial over the
    first writer's newer one: it raises ConflictError instead, and the first
    writer's turn completes untouched.
    """
    # a stream long enough to be still running after the second writer's steps: the
    # deltas that arrive meanwhile are coalesced, so a short one would end early
    fake.configure(chunk_delay=0.05, reply_words=40)
    first = chat_for(store, fake, conversation_id="shared")
    gen = first.stream("a1")
    shown = next(gen)
    second = chat_for(store, fake, conversation_id="shared")
    assert second.interrupted is not None  # it cannot tell a live writer from a dead one
    shown += next(gen) + next(gen)
    with pytest.raises(ConflictError):
        second.send("b1")
    shown += next(gen)  # the reload above is stale again
    with pytest.raises(ConflictError):
        second.retry()
    shown += "".join(gen)
    conv = fresh(url, "shared")
    assert roles(conv) == [("user", "complete"), ("assistant", "complete")]
    assert conv.messages[-1].content == shown


@pytest.mark.invariant(5)
def test_second_writer_never_cuts_a_live_stream(url: str, store: Any,
                                                 fake: FakeModel) -> None:
    """The streaming writer holds the conversation's lease: a second writer gets
    ConversationInUse naming host and pid (nothing written) and the stream ends whole."""
    first = chat_for(store, fake, conversation_id="shared")
    gen = first.stream("a1")
    shown = next(gen) + next(gen)
    second = chat_for(store, fake, conversation_id="shared")
    before = fresh(url, "shared")
    with pytest.raises(ConversationInUse) as info:
        second.send("b1")
    assert f"host {socket.gethostname()}, pid {os.getpid()}" in str(info.value)
    assert fresh(url, "shared").messages == before.messages
    shown += "".join(gen)
    second.send("b1")  # the lease is free once the turn ended
    conv = fresh(url, "shared")
    assert roles(conv) == [("user", "complete"), ("assistant", "complete")] * 2
    assert conv.messages[1].content == shown
    assert conv.messages[2].content == "b1"


def test_a_stream_dropped_before_its_first_step_releases_the_lease(url: str, store: Any,
                                                                  fake: FakeModel) -> None:
    """A generator never started never runs its finally; the lease must not stay held."""
    import gc

    first = chat_for(store, fake, conversation_id="dropped")
    gen = first.stream("a1")
    del gen
    gc.collect()
    second = chat_for(store, fake, conversation_id="dropped")
    assert second.send("b1").role == "assistant"  # not ConversationInUse


def test_second_writer_waits_for_a_live_stream(url: str, store: Any, fake: FakeModel) -> None:
    """With lease_wait the second writer waits for the turn to end, then goes on."""
    first = chat_for(store, fake, conversation_id="shared")
    gen = first.stream("a1")
    shown = next(gen)
    second = chat_for(store, fake, conversation_id="shared", lease_wait=60)
    done = threading.Event()
    errors: list[BaseException] = []

    def send() -> None:
        try:
            second.send("b1")
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=send)
    thread.start()
    assert not done.wait(0.5)  # it waits: the first writer still streams
    shown += "".join(gen)
    thread.join(60)
    assert not errors
    conv = fresh(url, "shared")
    assert roles(conv) == [("user", "complete"), ("assistant", "complete")] * 2
    assert conv.messages[1].content == shown
    assert conv.messages[2].content == "b1"


def test_the_lease_is_renewed_while_the_model_is_slow(url: str, store: Any) -> None:
    """No chunk for several lease terms: the renewal keeps the turn's lease all the same."""
    with FakeModel(latency=4.0) as slow:
        chat = chat_for(store, slow, conversation_id="slow", lease_term=0.6)
        thread = threading.Thread(target=chat.send, args=("a1",))
        thread.start()
        other = open_store(url)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the user message is stored: the call is out
            with contextlib.suppress(ChatstateError):
                if other.load("slow").messages:
                    break
            time.sleep(0.05)
        time.sleep(1.5)  # more than two terms of 0.6 s
        assert thread.is_alive()  # still waiting for the model's first byte
        with pytest.raises(ConversationInUse):
            other.acquire_lease("slow")
        thread.join(60)
    assert fresh(url, "slow").messages[-1].role == "assistant"
    other.release_lease(other.acquire_lease("slow"))  # the turn ended: released


@pytest.mark.invariant(5)
def test_two_chats_creating_one_conversation_both_land(url: str, store: Any,
                                                       fake: FakeModel) -> None:
    first = chat_for(store, fake, conversation_id="fresh", system=SYSTEM)
    second = chat_for(store, fake, conversation_id="fresh", system=SYSTEM)
    first.send("a1")
    second.send("b1")
    conv = fresh(url, "fresh")
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "user",
                                               "assistant"]


# -- the SDK backend -------------------------------------------------------------------------

def test_caller_supplied_openai_client(url: str, store: Any, fake: FakeModel) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=fake.base_url, api_key="sdk-key")
    chat = Chat(store, client=client, model="fake-model")
    reply = chat.send("plain")
    deltas = list(chat.stream("streamed"))
    conv = fresh(url, chat.id)
    assert conv.messages[1] == reply
    assert "".join(deltas) == conv.messages[3].content
    assert all(r["authorization"] for r in chat_requests(fake))


def test_an_interrupted_reply_in_parts_is_described_by_its_characters() -> None:
    """The note of a reply cut off counts its characters: the text of its parts when
    it is stored in parts (it counted the parts: "after 2 characters")."""
    from chatstate.core.content import text
    from chatstate.core.transcript import Conversation, Message
    from chatstate.session.turn_state import interrupted_turn

    user = Message.seal(None, role="user", content="hi", turn_id="t-1")
    partial = Message.seal(user, role="assistant", status="partial", turn_id="t-1",
                           content=[text("twelve chars"), text(" and ten!!")])
    found = interrupted_turn(Conversation(id="c1", messages=[user], partial=partial))
    assert found is not None
    assert "was cut off after 22 characters (kept as partial)" in found.describe()
