"""One record's model call, with every request counted as an attempt before it is sent.

The adapter's retry loop stays the only retry loop: each record gets a thin
``RetryingAdapter`` over the shared backend whose retry budget is the record's
remaining attempts and whose sleep hook commits one more attempt to the ledger
right before the next request leaves. So a record the model always fails on
gets exactly ``max_attempts`` requests in all, across kills and reruns, and a
process killed before a request is sent has used none for it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, ParamSpec, TypeVar

from chatstate.adapter import Completion, ModelAdapter, RetryingAdapter
from chatstate.errors import ChatstateError
from chatstate.stores.base import Store
from chatstate.stores.forwarding import ForwardingStore

P = ParamSpec("P")
T = TypeVar("T")


class OutOfAttempts(ChatstateError):
    """The ledger refused another attempt: none left, or the record is no longer ours.

    Internal: raised under ``_record.call`` and caught there; it never reaches a caller.
    """


class CountingAdapter:
    """A ModelAdapter for one record: ``count()`` runs right before every request."""

    def __init__(self, base: ModelAdapter, remaining: int, count: Callable[[], None], *,
                 first_counted: bool = False) -> None:
        self.model = base.model
        self._count = count
        self._first_counted = first_counted  # the claim already counted the first request
        self._inner: ModelAdapter = base
        if isinstance(base, RetryingAdapter):
            def sleep(seconds: float) -> None:
                time.sleep(seconds)
                count()  # the retry's request is sent as soon as this returns

            policy = replace(base.policy, max_retries=max(remaining - 1, 0))
            self._inner = RetryingAdapter(base.backend, model=base.model, policy=policy,
                                          sleep=sleep)

    def complete(self, messages: Sequence[Mapping[str, str]], *, model: str | None = None,
                 params: Mapping[str, Any] | None = None) -> Completion:
        self._before_request()
        return self._inner.complete(messages, model=model, params=params)

    def stream(self, messages: Sequence[Mapping[str, str]], *, model: str | None = None,
               params: Mapping[str, Any] | None = None) -> Iterator[str | Completion]:
        self._before_request()
        return self._inner.stream(messages, model=model, params=params)

    def _before_request(self) -> None:
        if self._first_counted:
            self._first_counted = False
        else:
            self._count()


class SerialisedStore(ForwardingStore):
    """A store whose calls never overlap: a store need not be thread-safe to take
    transcripts from batch's workers."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self._lock = threading.RLock()

    def _call(self, method: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        with self._lock:
            return method(*args, **kwargs)


def conversation_id(batch_id: str, record_id: str) -> str:
    """The transcript of a record's call: stable, valid as a conversation id."""
    digest = hashlib.sha256(record_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"batch-{batch_id}-{digest}"


def ask(adapter: ModelAdapter, prompt: str, *, system: str | None,
        params: Mapping[str, Any] | None) -> str:
    """One plain call: optional system message, then the prompt."""
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": prompt})
    return adapter.complete(messages, params=params or None).text


def ask_with_transcript(store: Store, cid: str, adapter: ModelAdapter, prompt: str, *,
                        system: str | None, title: str,
                        params: Mapping[str, Any] | None,
                        tools: Iterable[Any] | None = None) -> str:
    """The call as a one-turn conversation: persisted before the request, replayable after.

    A conversation that already holds a complete reply (the process died after
    the reply was stored but before its output was written) is answered from
    the store without calling the model again; an interrupted one is retried
    under the same turn. With ``tools`` the turn is a tool loop (its calls stored
    like every step, so a rerun never repeats a non-idempotent one).
    """
    from chatstate.session.chat import Chat

    chat = Chat(store, conversation_id=cid, adapter=adapter, system=system, title=title)
    if chat.interrupted is not None:
        return chat.retry(tools=tools, **dict(params or {})).text
    last = chat.conversation.last
    if last is not None and last.role == "assistant" and last.status == "complete":
        return last.text
    return chat.send(prompt, tools=tools, **dict(params or {})).text
