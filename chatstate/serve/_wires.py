"""The wire APIs ``serve`` answers, each as one ``Wire``: what differs between them.

A proxied request of any API runs the same turn (``app.Proxy._chat``): its
messages, in the stored (chat-completions) form, are made durable through the
turn writer before the request goes upstream, each streamed piece is saved
before it is relayed, and the reply is committed before its last event is. A
``Wire`` only says how to read that API's request into messages, where it goes
upstream, how its reply and stream are folded (the adapter's dialect), how its
errors, stored replies and failed streams look, and which headers carry the
credentials.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from chatstate.adapter.dialects import dialect
from chatstate.adapter.dialects.base import Reply, StreamDecoder
from chatstate.core.transcript import Message
from chatstate.serve._replay import replay_response
from chatstate.serve._stream_events import StreamEvents
from chatstate.serve._wire import openai_error, reply_fields

__all__ = ["CHAT", "Wire", "stored_reply"]


@dataclass(frozen=True)
class Wire:
    name: str
    upstream_path: str
    """Appended to the upstream base URL (``/chat/completions``)."""
    messages: Callable[[dict[str, Any]], list[dict[str, Any]]]
    """The request's messages in the stored form (ValueError: the request is misshapen)."""
    error: Callable[..., Response]
    """An error response in the API's own shape: (status, message, kind)."""
    reply_fields: Callable[[object], dict[str, Any]]
    """A non-streamed reply's stored fields (ValueError if misshapen)."""
    replay: Callable[[Message, bool, dict[str, str]], Response]
    """The stored reply of a request seen before, plain or streamed."""
    decoder: Callable[[], StreamDecoder] | None = None
    holds: Callable[[object], bool] | None = None
    named: bool = False
    rewrite: Callable[[], Callable[[str | None, Any], Any]] | None = None
    """A fresh per-stream rewriter of events (filling what the spec requires)."""
    key_headers: Callable[[str], dict[str, str]] | None = None
    """The upstream headers that carry the proxy's API key (Bearer by default)."""
    passed_headers: tuple[str, ...] = ()
    """Client request headers forwarded upstream as they are (``anthropic-version``)."""
    expand: Callable[[Any, str, dict[str, Any]], dict[str, Any]] | None = None
    """(store, namespace, request) -> the request it means (``previous_response_id``
    answered from the store); LookupError with ``rid``: unknown, a 404."""
    failures: Callable[[], StreamEvents] = StreamEvents
    """A fresh per-stream reader and writer of the API's error events (``_stream_events``)."""

    def settle(self, fields: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
        """A reply's stored fields with its finish reason settled by the adapter's dialect
        against the request that was forwarded (a Responses reply llama.cpp calls
        ``completed`` although ``max_output_tokens`` cut it is stored as cut)."""
        finish = fields.get("finish_reason") or ("tool_calls" if fields.get("tool_calls")
                                                 else "stop")
        reply = Reply(str(fields.get("content") or ""), fields.get("model"),
                      fields.get("usage"), finish)
        settled = dialect(self.name).settle(reply, request).finish_reason
        return dict(fields) if settled == finish else {**fields, "finish_reason": settled}


def stored_reply(reply: Reply) -> dict[str, Any]:
    """A dialect-decoded reply as ``Message.seal`` keywords (as ``reply_fields`` gives)."""
    fields: dict[str, Any] = {"content": reply.text, "model": reply.model, "usage": reply.usage}
    if reply.tool_calls:
        fields["tool_calls"] = reply.tool_calls
    if reply.extra:
        fields["extra"] = reply.extra
    if reply.finish_reason not in (None, "stop", "tool_calls"):
        fields["finish_reason"] = reply.finish_reason
    return fields


def _chat_messages(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = data["messages"]
    return messages


CHAT = Wire("chat_completions", "/chat/completions", _chat_messages, openai_error,
            reply_fields, replay_response)
