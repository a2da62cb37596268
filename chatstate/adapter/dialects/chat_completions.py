"""The chat-completions dialect (``POST /chat/completions``): requests, replies and
stream chunks, read strictly.

Both backends hand decoded JSON here, so a reply that is not shaped like an
OpenAI chat completion fails the same way whichever client fetched it.

Streamed tool calls are put together the chat-completions way: each delta in
``tool_calls`` names its call by ``index``; the first delta for an index
carries the id, type and function name, later ones append to the arguments
string. Tool calls are not text, so ``feed`` returns only text; the calls
surface whole in the final reply.

Public, for ``serve`` (which relays this format): ``StreamAccumulator``,
``parse_completion``, ``parse_usage``, ``provider_message``, ``context_overflow``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from chatstate.adapter._policy import AttemptFailed
from chatstate.adapter.dialects.base import (
    ErrorDetails,
    Overflow,
    Reply,
    Usage,
    bearer,
    joined,
    note_dropped,
    request_messages,
)

__all__ = [
    "CHAT_COMPLETIONS",
    "ChatCompletions",
    "StreamAccumulator",
    "context_overflow",
    "parse_completion",
    "parse_usage",
    "provider_message",
    "stream_error",
]

_RAW_LIMIT = 8000  # what is kept of an error body at all

# Message fields worth keeping besides content and tool_calls: a later request may need them.
EXTRA_FIELDS = ("refusal", "reasoning", "reasoning_content")
# Provider fields other dialects store, which a chat-completions request cannot carry.
FOREIGN_FIELDS = ("thinking_blocks", "reasoning_items")


def _malformed(detail: str) -> AttemptFailed:
    return AttemptFailed("malformed", f"malformed reply: {detail}")


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_usage(value: object) -> Usage | None:
    """Token counts, keeping one level of detail (``prompt_tokens_details.cached_tokens``)."""
    if not isinstance(value, Mapping):
        return None
    out: Usage = {}
    for k, v in value.items():
        if not isinstance(k, str):
            continue
        if _count(v):
            out[k] = v
        elif isinstance(v, Mapping):
            inner = {ik: iv for ik, iv in v.items() if isinstance(ik, str) and _count(iv)}
            if inner:
                out[k] = inner
    return out


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def parse_completion(data: object) -> Reply:
    """A non-streamed chat completion -> Reply; AttemptFailed("malformed") if misshapen."""
    if not isinstance(data, Mapping):
        raise _malformed("expected a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise _malformed("no choices in the chat completion")
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        raise _malformed("choice has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _malformed("message content is not text")
    calls = message.get("tool_calls")
    if calls is not None and (not isinstance(calls, list) or
                              not all(_is_whole_call(c) for c in calls)):
        raise _malformed("tool_calls is not a list of function calls with id, name and "
                         "arguments")
    return Reply(content or "", _str_or_none(data.get("model")), parse_usage(data.get("usage")),
                 _str_or_none(choices[0].get("finish_reason")),
                 [_call(c["id"], c["function"]["name"], c["function"]["arguments"])
                  for c in calls] if calls else None,
                 _extra(message))


def _is_whole_call(call: object) -> bool:
    if not isinstance(call, Mapping) or not isinstance(call.get("id"), str):
        return False
    function = call.get("function")
    return isinstance(function, Mapping) and isinstance(function.get("name"), str) and \
        isinstance(function.get("arguments"), str)


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _extra(message: Mapping[str, Any]) -> dict[str, Any] | None:
    kept = {k: message[k] for k in EXTRA_FIELDS if message.get(k) is not None}
    return kept or None


class StreamAccumulator:
    """Folds stream chunks into the reply so far; ``feed`` returns each chunk's text."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._extra: dict[str, Any] = {}
        self.model: str | None = None
        self.usage: Usage | None = None
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return joined(self._parts)

    def reply(self) -> Reply:
        calls = None
        if self._calls:
            calls = [self._calls[i] for i in sorted(self._calls)]
            incomplete = [c for c in calls if not c["id"] or not c["function"]["name"]]
            if incomplete:
                raise _malformed("a streamed tool call never got its id or function name")
        return Reply(self.text, self.model, self.usage, self.finish_reason, calls,
                     dict(self._extra) or None)

    def _feed_calls(self, deltas: object) -> None:
        if not isinstance(deltas, list):
            raise _malformed("stream delta tool_calls is not a list")
        for delta in deltas:
            index = delta.get("index") if isinstance(delta, Mapping) else None
            if not isinstance(index, int) or isinstance(index, bool):
                raise _malformed("stream tool call delta has no integer index")
            function = delta.get("function") or {}
            if not isinstance(function, Mapping):
                raise _malformed("stream tool call delta has a non-object function")
            call = self._calls.setdefault(index, _call("", "", ""))
            for key, value in (("id", delta.get("id")), ("type", delta.get("type"))):
                if isinstance(value, str) and value:
                    call[key] = value
            name, arguments = function.get("name"), function.get("arguments")
            if isinstance(name, str) and name:
                call["function"]["name"] = name
            if arguments is not None and not isinstance(arguments, str):
                raise _malformed("stream tool call arguments are not a string")
            call["function"]["arguments"] += arguments or ""

    def _feed_extra(self, delta: Mapping[str, Any]) -> None:
        for key in EXTRA_FIELDS:
            value = delta.get(key)
            if isinstance(value, str) and value:  # text fields that stream like content
                self._extra[key] = str(self._extra.get(key, "")) + value
            elif value is not None and not isinstance(value, str):
                self._extra[key] = value

    def feed(self, chunk: object) -> str:
        if not isinstance(chunk, Mapping):
            raise _malformed("stream chunk is not a JSON object")
        error = stream_error(chunk)
        if error is not None:
            raise AttemptFailed("provider", "the provider reported an error mid-stream",
                                provider_message=error[0], retryable=error[1])
        self.model = _str_or_none(chunk.get("model")) or self.model
        self.usage = parse_usage(chunk.get("usage")) or self.usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise _malformed("stream chunk has no choices list")
        if not choices:  # the final usage-only chunk
            return ""
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        if not isinstance(delta, Mapping):
            raise _malformed("stream chunk has no delta")
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise _malformed("stream delta content is not text")
        self.finish_reason = _str_or_none(choice.get("finish_reason")) or self.finish_reason
        if delta.get("tool_calls") is not None:
            self._feed_calls(delta["tool_calls"])
        self._feed_extra(delta)
        if content:
            self._parts.append(content)
        return content or ""


def provider_message(body: object) -> str | None:
    """The provider's own error text from an error body (JSON object or raw text)."""
    if isinstance(body, (bytes, str)):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            body = json.loads(text)
        except ValueError:
            return text.strip()[:_RAW_LIMIT] or None
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping):
            error = error.get("message")
        if isinstance(error, str) and error:
            return error[:_RAW_LIMIT]
    return None


def stream_error(chunk: Mapping[str, Any]) -> tuple[str, bool] | None:
    """An ``{"error": ...}`` event inside a stream -> (message, retryable), else None."""
    error = chunk.get("error")
    if not error:
        return None
    message = provider_message(chunk) or "the provider reported an error mid-stream"
    kind = error.get("type") if isinstance(error, Mapping) else None
    return message, kind in ("server_error", "overloaded_error", "rate_limit_error")


# llama.cpp: "request (831 tokens) exceeds the available context size (512 tokens)";
# OpenAI: "maximum context length is 8192 tokens. However, your messages resulted in 9000
# tokens"; vLLM: "maximum context length is 2048 tokens. However, you requested 2100 tokens".
_LLAMA_OVERFLOW = re.compile(r"\((\d+) tokens\) exceeds the available context size "
                             r"\((\d+) tokens\)")
_OPENAI_OVERFLOW = re.compile(r"maximum context length is (\d+) tokens.*?"
                              r"(?:resulted in|requested) (\d+) tokens", re.S)
_OVERFLOW_WORDS = ("exceeds the available context size", "maximum context length",
                   "context_length_exceeded", "exceed_context_size")


def context_overflow(body: object) -> Overflow | None:
    """(window, prompt tokens) when an error body says the prompt does not fit, else None.

    Either number may be None when the provider does not say it.
    """
    if isinstance(body, (bytes, str)):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            body = json.loads(text)
        except ValueError:
            body = {"error": {"message": text}}
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping):
        return None
    text = " ".join(str(error.get(k, "")) for k in ("message", "type", "code"))
    if not any(word in text for word in _OVERFLOW_WORDS):
        return None
    window, prompt = error.get("n_ctx"), error.get("n_prompt_tokens")
    llama, openai = _LLAMA_OVERFLOW.search(text), _OPENAI_OVERFLOW.search(text)
    if llama:
        prompt, window = int(llama.group(1)), int(llama.group(2))
    elif openai:
        window, prompt = int(openai.group(1)), int(openai.group(2))
    return (window if _count(window) else None, prompt if _count(prompt) else None)


class ChatCompletions:
    """The OpenAI chat-completions format, spoken by most OpenAI-compatible servers."""

    name = "chat_completions"
    path = "/chat/completions"
    sse_events = frozenset({"message", "error"})  # other named events (pings) carry no chunk
    sse_done = "[DONE]"

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def encode(self, messages: Sequence[Mapping[str, Any]], *, model: str,
               params: Mapping[str, Any] | None, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = dict(params or {})
        body["model"] = model
        pairs = request_messages(messages)
        body["messages"] = [plain for plain, _ in pairs]
        note_dropped(self.name, {key: sum(len(fields.get(key) or ()) for _, fields in pairs)
                                 for key in FOREIGN_FIELDS})
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        else:
            body.pop("stream", None)
            body.pop("stream_options", None)
        return body

    def decode(self, data: object) -> Reply:
        return parse_completion(data)

    def stream_decoder(self) -> StreamAccumulator:
        return StreamAccumulator()

    def settle(self, reply: Reply, body: Mapping[str, Any]) -> Reply:
        return reply  # chat completions says "length" itself for a reply cut at the limit

    def error_details(self, body: object) -> ErrorDetails:
        return ErrorDetails(provider_message(body), context_overflow(body))

    def headers(self, api_key: str | None) -> dict[str, str]:
        return bearer(api_key)


CHAT_COMPLETIONS = ChatCompletions()
