"""What a wire API (a dialect) must say, so that the one retry loop and the backends can speak it.

A dialect knows one request/response format and nothing of HTTP errors,
retries or clients: it turns the whole message list into a request body,
decoded JSON back into a ``Reply``, and stream events, one at a time, into a
``StreamDecoder``. Everything it finds misshapen, or an error the provider
reports inside a reply or a stream, it raises as ``AttemptFailed`` (kind
``malformed`` or ``provider``), which the retry loop judges like any failed
attempt. A backend sends what the dialect encoded to ``path`` and asks the
dialect to read error bodies; ``chatstate.adapter.dialects`` names the known
dialects.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from chatstate.core.provider_fields import PROVIDER_FIELDS

__all__ = ["PROVIDER_FIELDS", "AllEventsBut", "Dialect", "ErrorDetails", "Overflow", "Reply",
           "StreamDecoder", "Usage", "bearer", "note_dropped", "request_messages"]

log = logging.getLogger("chatstate.adapter")

Usage = dict[str, "int | dict[str, int]"]
Overflow = tuple["int | None", "int | None"]
"""(context window, prompt tokens) when a provider said the prompt does not fit; either
may be None when it does not say."""


class Reply(NamedTuple):
    """A decoded reply, in the stored (chat-completions) form whatever the dialect."""

    text: str
    model: str | None
    usage: Usage | None
    finish_reason: str | None
    tool_calls: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class ErrorDetails(NamedTuple):
    """What an error body says: the provider's own text and a context overflow, if any."""

    provider_message: str | None
    overflow: Overflow | None


def joined(parts: list[str]) -> str:
    """The text of ``parts``, which then hold it as one string: a long stream's text is
    kept once, not once in its pieces and again in each join of them."""
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0] if parts else ""


class StreamDecoder(Protocol):
    """Folds one attempt's stream events into the reply so far (a new one per attempt)."""

    finish_reason: str | None
    """Why the reply stopped; None until the stream said so (a stream that ends
    without it was cut short)."""
    model: str | None
    """The model the stream names, once it has said."""

    @property
    def text(self) -> str:
        """The text so far."""
        ...

    def feed(self, event: object) -> str:
        """Fold one decoded event in; return its new text ("" for none)."""
        ...

    def reply(self) -> Reply:
        """The whole reply, once the stream is finished."""
        ...


class Dialect(Protocol):
    """One wire API's request and reply format."""

    @property
    def name(self) -> str:
        """The ``api`` setting that selects this dialect."""
        ...

    @property
    def path(self) -> str:
        """Appended to the base URL: where requests go (``/chat/completions``)."""
        ...

    @property
    def sse_events(self) -> Container[str]:
        """Server-sent event names whose data is a stream event; others (pings) are skipped."""
        ...

    @property
    def sse_done(self) -> str | None:
        """The event data that ends a stream (``[DONE]``), or None if the body's end does."""
        ...

    def encode(self, messages: Sequence[Mapping[str, Any]], *, model: str,
               params: Mapping[str, Any] | None, stream: bool) -> dict[str, Any]:
        """The request body for the whole message list (the caller's ``params`` merged in)."""
        ...

    def decode(self, data: object) -> Reply:
        """A non-streamed reply's decoded JSON -> Reply; AttemptFailed("malformed") if misshapen."""
        ...

    def stream_decoder(self) -> StreamDecoder:
        """A fresh decoder for one streamed attempt."""
        ...

    def settle(self, reply: Reply, body: Mapping[str, Any]) -> Reply:
        """The decoded ``reply`` with its finish reason settled against the request ``body``
        that asked for it (plain or streamed): an upstream that reports a reply cut at the
        requested limit as finished is read as cut ("length"). Most dialects return
        ``reply`` as it is."""
        ...

    def error_details(self, body: object) -> ErrorDetails:
        """Read an HTTP error body (bytes, text or decoded JSON)."""
        ...

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The request headers that carry ``api_key`` (and any the API requires)."""
        ...


def bearer(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer KEY`` (the OpenAI APIs), or nothing without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class AllEventsBut(frozenset[str]):
    """Every SSE event name except these (``ping``): for APIs that name each event."""

    def __contains__(self, name: object) -> bool:
        return not super().__contains__(name)


def request_messages(messages: Sequence[Mapping[str, Any]]
                     ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(the message without its provider fields, the provider fields) for each message."""
    out = []
    for message in messages:
        plain = dict(message)
        fields = plain.pop(PROVIDER_FIELDS, None)
        out.append((plain, dict(fields) if isinstance(fields, Mapping) else {}))
    return out


def note_dropped(api: str, dropped: Mapping[str, int]) -> None:
    """Say which stored provider fields this request leaves out (they stay in the store)."""
    what = ", ".join(f"{n} {name}" for name, n in sorted(dropped.items()) if n)
    if what:
        log.info("left out of this %s request (the API cannot express them; the transcript "
                 "keeps them): %s", api, what)
