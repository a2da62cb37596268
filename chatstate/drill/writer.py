"""The drill's writer: a warmed-up fork server whose children chat until they are SIGKILLed.

    python -m chatstate.drill.writer URL BASE_URL PREFIX CONVERSATIONS TIMEOUT

Importing chatstate and warming an HTTP client up takes most of a second, and
the drill kills hundreds of writers; so this process imports once, prints
``["ready"]``, then forks one writer per ``go TRIAL SEED`` line on stdin. A
forked writer is a real process with its own store handle and HTTP
connections, so SIGKILL hits it exactly as it would hit a chat client.

The writer opens the store (recovery), holds conversations ``PREFIX0`` ...
``PREFIX<N-1>`` (every third plain, the others streamed) and runs turns on
them round-robin against the fake model until it is killed, reporting on
stdout what it does (see ``_common`` for the line format): each store
operation as it starts and returns, every acknowledged message with its seq
and hash, and every piece of text only after ``Chat`` handed it over (i.e.
once it is stored). The server reaps each writer and prints
``["reaped", PID, STATUS]`` after everything the writer printed.

A writer never lives longer than TIMEOUT seconds (SIGALRM), whatever happens
to the drill that started it. Imports stay lean: the httpx2 wire backend, no
openai SDK, no pydantic-settings (the drill ignores the user's model config).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from chatstate.adapter import Completion, RetryingAdapter, RetryPolicy
from chatstate.core.transcript import Conversation, Message
from chatstate.drill._common import conversation_ids, emit, reopen, scheme_of, stream_kind
from chatstate.session.chat import Chat
from chatstate.stores.forwarding import ForwardingStore

THINK_SECONDS = 0.004
"""A writer pauses 4-8 ms before each turn, like a client between two messages: a window
in which nothing of the turn is written yet, to kill in."""

LEASE_WAIT = 10.0
"""Seconds a turn waits for its conversation's writer lease: the drill's own rekey holds
it while it re-encrypts the conversation (a killed writer's lease is taken over at once)."""


def make_adapter(base_url: str) -> RetryingAdapter:
    """An adapter for the fake model: the wire backend, a short retry budget, no user config."""
    from chatstate.adapter.backends.wire import WireBackend

    backend = WireBackend(base_url, None, timeout=30.0, connect_timeout=5.0)
    return RetryingAdapter(backend, model="fake-model",
                           policy=RetryPolicy(max_retries=2, backoff_base=0.05,
                                              backoff_max=0.5))


class ReportingStore(ForwardingStore):
    """A store that says on the pipe when each write starts and what its return acknowledged."""

    def create(self, conversation: Conversation) -> None:
        emit(["w", "create"])
        super().create(conversation)
        emit(["a", "create", conversation.id, []])

    def append(self, conversation_id: str, messages: Sequence[Message], *,
               fence: str | None = None) -> None:
        emit(["w", "append"])
        super().append(conversation_id, messages, fence=fence)
        emit(["a", "append", conversation_id,
              [[m.seq, m.hash, m.turn_id, m.role] for m in messages]])

    def save_partial(self, conversation_id: str, partial: Message, *,
                     fence: str | None = None) -> None:
        emit(["w", "save_partial"])
        super().save_partial(conversation_id, partial, fence=fence)
        emit(["a", "save_partial", conversation_id, []])

    def clear_partial(self, conversation_id: str, *, fence: str | None = None) -> None:
        emit(["w", "clear_partial"])
        super().clear_partial(conversation_id, fence=fence)
        emit(["a", "clear_partial", conversation_id, []])

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None, fence: str | None = None) -> None:
        emit(["w", "set_header"])
        super().set_header(conversation_id, title=title, metadata=metadata, fence=fence)
        emit(["a", "set_header", conversation_id, []])

    def delete(self, conversation_id: str) -> None:
        emit(["w", "delete"])
        super().delete(conversation_id)
        emit(["a", "delete", conversation_id, []])


class ReportingAdapter:
    """The model adapter, saying on the pipe when a request starts."""

    def __init__(self, adapter: RetryingAdapter, cid: str) -> None:
        self._adapter = adapter
        self.model = adapter.model
        self._cid = cid

    def complete(self, messages: Sequence[Mapping[str, str]], *, model: str | None = None,
                 params: Mapping[str, Any] | None = None) -> Completion:
        emit(["call", self._cid])
        return self._adapter.complete(messages, model=model, params=params)

    def stream(self, messages: Sequence[Mapping[str, str]], *, model: str | None = None,
               params: Mapping[str, Any] | None = None) -> Iterator[str | Completion]:
        emit(["call", self._cid])
        yield from self._adapter.stream(messages, model=model, params=params)


def hold(url: str, adapter: RetryingAdapter, prefix: str, count: int, trial: int,
         seed: int) -> None:
    """One writer: open the store, then run turns round-robin until killed."""
    emit(["pid", os.getpid()])
    rng = random.Random(seed)
    emit(["w", "open"])
    store = reopen(url)
    emit(["a", "open", "", []])
    reporting = ReportingStore(store)
    ids = conversation_ids(prefix, count)
    chats = [Chat(reporting, conversation_id=cid, adapter=ReportingAdapter(adapter, cid),
                  title=f"chatstate drill {cid}", flush_interval=0.0, lease_wait=LEASE_WAIT)
             for cid in ids]
    start = rng.randrange(count)
    for n in range(1_000_000):
        index = (start + n) % count
        turn(chats[index], stream_kind(index), f"q{trial}.{n}", rng)


def turn(chat: Chat, kind: str, text: str, rng: random.Random) -> None:
    cid = chat.id
    emit(["b", cid, kind])
    time.sleep(rng.uniform(THINK_SECONDS, 2 * THINK_SECONDS))
    if kind == "plain":
        reply: Message = chat.send(text)
        emit(["d", cid, reply.turn_id, reply.content])
        emit(["e", cid, reply.turn_id])
        return
    deltas = chat.stream(text)
    turn_id = chat.messages[-1].turn_id  # the user message is stored: stream() appended it
    for delta in deltas:
        emit(["d", cid, turn_id, delta])
    emit(["e", cid, turn_id])


def serve(url: str, base_url: str, prefix: str, count: int, timeout: int) -> None:
    from chatstate.durable import guard  # noqa: F401  (sqlite's open() inspects the filesystem)
    from chatstate.stores import store_class

    store_class(scheme_of(url))  # import the store's module here, not in every writer
    from chatstate.stores.keys import configured

    if configured():  # drill --encrypted: the sealing layer and its cipher, here too
        from chatstate.stores.codec import AeadCodec, new_key, parse_key
        from chatstate.stores.sealed import seal_opened  # noqa: F401

        AeadCodec(parse_key(new_key(), "warm-up")).seal_text("message", "warm", 0, "{}", None)
    warm = make_adapter(base_url)
    warm.complete([{"role": "user", "content": "warm up"}])  # load every lazy import
    for _ in warm.stream([{"role": "user", "content": "warm up"}]):
        pass
    warm.close()
    Message.seal(None, role="user", content="warm up", turn_id="t-warm")
    # Made once, never used here: each forked writer gets a copy with an empty pool.
    adapter = make_adapter(base_url)
    emit(["ready"])
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 3 or parts[0] != "go":
            break
        pid = os.fork()
        if pid == 0:
            _writer(url, adapter, prefix, count, int(parts[1]), int(parts[2]), timeout)
        _, status = os.waitpid(pid, 0)
        emit(["reaped", pid, status])


def _writer(url: str, adapter: RetryingAdapter, prefix: str, count: int, trial: int,
            seed: int, timeout: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.alarm(timeout)  # a writer outlives no drill: SIGALRM ends it
    try:
        hold(url, adapter, prefix, count, trial, seed)
    except BaseException as exc:  # nothing may escape a fork
        emit(["err", f"{type(exc).__name__}: {exc}"[:2000]])
        # Wait for the runner's SIGKILL (or the alarm): a writer that exited on its own
        # could have its pid reused before the runner's kill arrives.
        while True:
            time.sleep(3600)
    finally:
        os._exit(1)


def main(argv: Sequence[str]) -> None:
    url, base_url, prefix, count, timeout = argv
    serve(url, base_url, prefix, int(count), int(timeout))


if __name__ == "__main__":
    main(sys.argv[1:])
