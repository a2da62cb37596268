"""The Anthropic Messages dialect (``POST /messages``): content blocks in and out.

From the stored (chat-completions) form: system messages go to the top-level
``system``; user content parts become ``text``, ``image`` and ``document``
blocks (data URLs as base64 sources); an assistant message becomes its
thinking blocks (kept from an earlier Anthropic reply and sent back exactly as
they came, signature and all), its text and one ``tool_use`` block per tool
call; ``tool`` messages become ``tool_result`` blocks in a user message.
Consecutive messages of one role are merged (the API wants them alternating).
``max_tokens`` is required by the API: the caller's, else 4096.

A reply's ``stop_reason`` is the stored finish_reason: ``end_turn`` and
``stop_sequence`` are "stop", ``tool_use`` "tool_calls", ``max_tokens`` "length"
(a cut reply), ``refusal`` "content_filter". Thinking blocks are kept in
``extra["thinking_blocks"]``, a server tool's blocks (``server_tool_use``,
``web_search_tool_result``, ...) in ``extra["server_blocks"]``, each as it came, and
sent back in that order before the text. Errors: 429 ``rate_limit_error`` and 529
``overloaded_error`` are retried (every 5xx is), ``prompt is too long`` is a
context overflow; an ``error`` event mid-stream fails the attempt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from chatstate.adapter._policy import AttemptFailed
from chatstate.adapter.dialects.base import (
    AllEventsBut,
    ErrorDetails,
    Overflow,
    Reply,
    Usage,
    joined,
    note_dropped,
    request_messages,
)
from chatstate.adapter.dialects.chat_completions import context_overflow, provider_message

__all__ = ["ANTHROPIC_MESSAGES", "AnthropicMessages", "MessagesStream", "encode_messages",
           "parse_message"]

VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls",
                "max_tokens": "length", "refusal": "content_filter", "pause_turn": "stop",
                "model_context_window_exceeded": "length"}
_RETRYABLE = ("overloaded_error", "api_error", "rate_limit_error", "timeout_error")
_CHAT_ONLY = ("stream_options", "n", "logprobs", "top_logprobs", "seed", "frequency_penalty",
              "presence_penalty", "logit_bias", "response_format", "max_completion_tokens",
              "parallel_tool_calls", "reasoning_effort", "user", "stop")
_DATA_URL = re.compile(r"data:([^;,]+);base64,(.*)", re.S)
_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")


def _malformed(detail: str) -> AttemptFailed:
    return AttemptFailed("malformed", f"malformed reply: {detail}")


def _source(url: str) -> dict[str, Any]:
    match = _DATA_URL.fullmatch(url)
    if match:
        return {"type": "base64", "media_type": match.group(1), "data": match.group(2)}
    return {"type": "url", "url": url}


def _block(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "image_url":
        return {"type": "image", "source": _source(str((part.get("image_url") or {}).get("url")))}
    if kind == "file":
        inner = part.get("file") or {}
        block: dict[str, Any] = {"type": "document",
                                 "source": _source(str(inner.get("file_data", "")))}
        if inner.get("filename"):
            block["title"] = inner["filename"]
        return block
    return dict(part)


def _blocks(content: object) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [_block(p) for p in content or () if isinstance(p, Mapping)] \
        if isinstance(content, list) else []


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def encode_messages(messages: Sequence[Mapping[str, Any]]
                    ) -> tuple[str | None, list[dict[str, Any]], dict[str, int]]:
    """(the system text, the Anthropic messages, what was left out by kind)."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    dropped = {"reasoning_items": 0}

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message, fields in request_messages(messages):
        role, content = message.get("role"), message.get("content")
        dropped["reasoning_items"] += len(fields.get("reasoning_items") or ())
        if role == "system":
            text = content if isinstance(content, str) else "".join(
                str(b.get("text", "")) for b in _blocks(content) if b.get("type") == "text")
            system.append(text)
        elif role == "tool":
            result: dict[str, Any] = {"type": "tool_result",
                                      "tool_use_id": message.get("tool_call_id"),
                                      "content": content if isinstance(content, str)
                                      else _blocks(content)}
            add("user", [result])
        elif role == "assistant":
            blocks = [dict(b) for key in ("thinking_blocks", "server_blocks")
                      for b in fields.get(key) or () if isinstance(b, Mapping)]
            blocks += _blocks(content)
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                blocks.append({"type": "tool_use", "id": call.get("id"),
                               "name": function.get("name"),
                               "input": _input(str(function.get("arguments", "")))})
            add("assistant", blocks)
        else:
            add("user", _blocks(content))
    return ("\n\n".join(s for s in system if s) or None), out, dropped


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") == "function" and isinstance(function, Mapping):
        out = {"name": function.get("name"),
               "input_schema": function.get("parameters") or {"type": "object"}}
        if function.get("description"):
            out["description"] = function["description"]
        return out
    return dict(tool)


def _tool_choice(choice: object) -> object:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        return {"type": "tool", "name": choice["function"].get("name")}
    return choice


def encode_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    given = dict(params or {})
    body = {k: v for k, v in given.items() if k not in _CHAT_ONLY}
    body["max_tokens"] = given.get("max_tokens", given.get("max_completion_tokens",
                                                           DEFAULT_MAX_TOKENS))
    if given.get("stop") and "stop_sequences" not in body:
        stop = given["stop"]
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if isinstance(body.get("tools"), list):
        body["tools"] = [_tool(t) for t in body["tools"] if isinstance(t, Mapping)]
    if "tool_choice" in body:
        body["tool_choice"] = _tool_choice(body["tool_choice"])
    return body


def parse_usage(value: object) -> Usage | None:
    """Anthropic token counts in the stored names (prompt counts cached input too)."""
    if not isinstance(value, Mapping):
        return None

    def n(key: str) -> int:
        v = value.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    if not any(k in value for k in ("input_tokens", "output_tokens")):
        return None
    prompt = n("input_tokens") + n("cache_read_input_tokens") + n("cache_creation_input_tokens")
    out: Usage = {"prompt_tokens": prompt, "completion_tokens": n("output_tokens"),
                  "total_tokens": prompt + n("output_tokens")}
    if n("cache_read_input_tokens"):
        out["prompt_tokens_details"] = {"cached_tokens": n("cache_read_input_tokens")}
    return out


def _fold(blocks: object) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    if not isinstance(blocks, list):
        raise _malformed("the message has no content list")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    server: list[dict[str, Any]] = []
    for block in blocks:
        if not isinstance(block, Mapping):
            raise _malformed("a content block is not an object")
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _malformed("a tool_use block has no id or name")
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
        elif kind in ("thinking", "redacted_thinking"):
            thinking.append(dict(block))
        else:  # a server tool's use and result (web search, code execution, ...)
            server.append(dict(block))
    extra: dict[str, Any] = {"thinking_blocks": thinking} if thinking else {}
    if server:
        extra["server_blocks"] = server
    return "".join(texts), calls, extra


def _finish(stop_reason: object) -> str:
    return STOP_REASONS.get(str(stop_reason), "stop")


def parse_message(data: object) -> Reply:
    """A non-streamed Anthropic message -> Reply; AttemptFailed("malformed") if misshapen."""
    if not isinstance(data, Mapping):
        raise _malformed("expected a JSON object")
    if data.get("type") == "error":
        raise _error(data)
    text, calls, extra = _fold(data.get("content"))
    model = data.get("model")
    return Reply(text, model if isinstance(model, str) else None, parse_usage(data.get("usage")),
                 _finish(data.get("stop_reason")), calls or None, extra or None)


def _error(event: Mapping[str, Any]) -> AttemptFailed:
    error = event.get("error") if isinstance(event.get("error"), Mapping) else {}
    assert isinstance(error, Mapping)
    return AttemptFailed("provider", "the provider reported an error mid-stream",
                         provider_message=str(error.get("message") or error.get("type")),
                         retryable=error.get("type") in _RETRYABLE)


class MessagesStream:
    """Folds Anthropic stream events; the reply is finished only at ``message_stop``."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self.model: str | None = None
        self._usage: dict[str, Any] = {}
        self._stop: object = None
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return joined(self._parts)

    def feed(self, event: object) -> str:
        if not isinstance(event, Mapping):
            raise _malformed("stream event is not a JSON object")
        kind = event.get("type")
        if kind == "error":
            raise _error(event)
        if kind == "message_start":
            message = event.get("message")
            if not isinstance(message, Mapping):
                raise _malformed("message_start has no message")
            self.model = message.get("model") if isinstance(message.get("model"), str) else None
            self._usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            index, block = event.get("index"), event.get("content_block")
            if not isinstance(index, int) or not isinstance(block, Mapping):
                raise _malformed("content_block_start has no index or block")
            self._blocks[index] = dict(block)
        elif kind == "content_block_delta":
            return self._delta(event)
        elif kind == "content_block_stop":
            index = event.get("index")
            if isinstance(index, int) and index in self._json:
                block = self._blocks.get(index, {})
                block["input"] = _input("".join(self._json.pop(index)))
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, Mapping):
                self._stop = delta.get("stop_reason")
            usage = event.get("usage")
            if isinstance(usage, Mapping):
                self._usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self.finish_reason = _finish(self._stop)
        return ""

    def _delta(self, event: Mapping[str, Any]) -> str:
        index, delta = event.get("index"), event.get("delta")
        if not isinstance(index, int) or not isinstance(delta, Mapping):
            raise _malformed("content_block_delta has no index or delta")
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            text = str(delta.get("text", ""))
            block["text"] = str(block.get("text", "")) + text
            self._parts.append(text)
            return text
        if kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking", "")) + str(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block["signature"] = str(block.get("signature", "")) + str(delta.get("signature", ""))
        return ""

    def reply(self) -> Reply:
        _, calls, extra = _fold([self._blocks[i] for i in sorted(self._blocks)])
        return Reply(self.text, self.model, parse_usage(self._usage), self.finish_reason,
                     calls or None, extra or None)


def context_too_long(body: object) -> Overflow | None:
    """Anthropic's "prompt is too long: N tokens > W maximum", else the OpenAI shapes."""
    message = provider_message(body) or ""
    match = _TOO_LONG.search(message)
    if match:
        return int(match.group(2)), int(match.group(1))
    if "prompt is too long" in message:
        return None, None
    return context_overflow(body)


class AnthropicMessages:
    """Anthropic's Messages API (also llama.cpp's ``/v1/messages``)."""

    name = "anthropic_messages"
    path = "/messages"
    sse_events = AllEventsBut({"ping"})
    sse_done = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def encode(self, messages: Sequence[Mapping[str, Any]], *, model: str,
               params: Mapping[str, Any] | None, stream: bool) -> dict[str, Any]:
        body = encode_params(params)
        system, encoded, dropped = encode_messages(messages)
        note_dropped(self.name, dropped)
        body["model"] = model
        if system is not None and "system" not in body:
            body["system"] = system
        body["messages"] = encoded
        if stream:
            body["stream"] = True
        else:
            body.pop("stream", None)
        return body

    def decode(self, data: object) -> Reply:
        return parse_message(data)

    def stream_decoder(self) -> MessagesStream:
        return MessagesStream()

    def settle(self, reply: Reply, body: Mapping[str, Any]) -> Reply:
        return reply  # Messages says ``max_tokens`` itself for a reply cut at the limit

    def error_details(self, body: object) -> ErrorDetails:
        return ErrorDetails(provider_message(body), context_too_long(body))

    def headers(self, api_key: str | None) -> dict[str, str]:
        out = {"anthropic-version": VERSION}
        if api_key:
            out["x-api-key"] = api_key
        return out


ANTHROPIC_MESSAGES = AnthropicMessages()
