"""Nothing is dropped silently: a partial reply that could not be kept, a final reply that
does not extend what was shown.

The adapters here are third-party implementations of the public ``ModelAdapter``
protocol (the built-in one never diverges: it refuses a retried stream that
contradicts what it showed), so they produce on purpose what a careless one would.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from chatstate import Chat, ModelError, open_store
from chatstate.adapter.base import Completion


class Scripted:
    """Streams ``deltas``, then ends with ``final`` (a Completion) or raises ``error``."""

    model = "scripted"

    def __init__(self, deltas: list[str], final: str | None = None,
                 before_end: Any = None) -> None:
        self.deltas, self.final, self.before_end = deltas, final, before_end

    def complete(self, messages: Sequence[Mapping[str, str]], *, model: str | None = None,
                 params: Mapping[str, Any] | None = None) -> Completion:
        raise AssertionError("only streamed here")

    def stream(self, messages: Sequence[Mapping[str, str]], *, model: str | None = None,
               params: Mapping[str, Any] | None = None) -> Iterator[str | Completion]:
        yield from self.deltas
        if self.before_end is not None:
            self.before_end()
        if self.final is None:
            raise ModelError("the connection dropped", retryable=True)
        yield Completion(self.final, self.model, None, "stop")


@pytest.mark.invariant(2)
def test_a_final_reply_that_does_not_extend_what_was_shown_is_logged_and_kept(
        local_store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(local_store_url)
    chat = Chat(store, conversation_id="c1", adapter=Scripted(["Hello ", "wor"], "Goodbye"),
                flush_interval=0)
    with caplog.at_level(logging.WARNING, logger="chatstate.session"):
        shown = "".join(chat.stream("hi"))
    assert shown == "Hello wor"
    [record] = [r for r in caplog.records if "does not extend" in r.getMessage()]
    assert "seq 1" in record.getMessage()
    assert "9 chars" in record.getMessage()
    conv = open_store(local_store_url).load("c1")
    assert conv.messages[-1].content == "Goodbye"
    assert conv.verify() is None
    assert conv.metadata["divergent_replies"] == [{"seq": 1, "shown_chars": 9}]


def test_a_partial_reply_that_could_not_be_saved_is_logged(
        local_store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(local_store_url)
    other = open_store(local_store_url)  # another process removes the conversation mid-reply
    chat = Chat(store, conversation_id="c1",
                adapter=Scripted(["twelve chars"], None, lambda: other.delete("c1")),
                flush_interval=3600)  # nothing flushed before the error: all still pending
    with caplog.at_level(logging.WARNING, logger="chatstate.session"), \
            pytest.raises(ModelError):
        "".join(chat.stream("hi"))
    [record] = [r for r in caplog.records if "interrupted reply" in r.getMessage()]
    assert "12 chars at seq 1" in record.getMessage()
    assert "c1" in record.getMessage()
