"""The fake model's Anthropic Messages side (``POST /v1/messages``): requests read into
chat messages, replies written as Anthropic messages and as its SSE event stream.

As for Responses (``_responses``), the request is translated into the chat
messages it means and answered as the chat fake answers them. A request with
``thinking`` gets a thinking block first, signed; a request that sends back a
thinking block whose text or signature was changed is refused (400) as
Anthropic refuses it. Errors use Anthropic's shapes (``overloaded_error`` with
529, ``rate_limit_error`` with 429, "prompt is too long" for the window).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from chatstate.testing._responses import sign

__all__ = ["error_body", "events", "message_body", "request_messages"]

STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error",
            403: "permission_error", 404: "not_found_error", 413: "request_too_large",
            429: "rate_limit_error", 529: "overloaded_error"}.get(
        status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _source_part(block: Mapping[str, Any]) -> dict[str, Any]:
    source = block.get("source") if isinstance(block.get("source"), Mapping) else {}
    assert isinstance(source, Mapping)
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    else:
        url = str(source.get("url", ""))
    if block.get("type") == "image":
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "file", "file": {"file_data": url}}


def _text_or_parts(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(b.get("type") == "text" for b in blocks):
        return "".join(str(b.get("text", "")) for b in blocks)
    return blocks


def request_messages(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """(the chat messages an Anthropic request means, an error text if it is refused)."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(str(b.get("text", "")) for b in system if isinstance(b, Mapping))
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    given = body.get("messages")
    if not isinstance(given, list):
        return [], "messages: Field required (fake)"
    for message in given:
        if not isinstance(message, Mapping):
            return [], "messages must be objects (fake)"
        role, content = str(message.get("role")), message.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            return [], f"messages.{len(messages)}.content must be a string or a list (fake)"
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for block in content:
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "text":
                parts.append({"type": "text", "text": str(block.get("text", ""))})
            elif kind in ("image", "document"):
                parts.append(_source_part(block))
            elif kind == "tool_use":
                calls.append({"id": str(block.get("id")), "type": "function", "function": {
                    "name": str(block.get("name")),
                    "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result":
                inner = block.get("content", "")
                text = inner if isinstance(inner, str) else "".join(
                    str(b.get("text", "")) for b in inner if isinstance(b, Mapping)) \
                    if isinstance(inner, list) else ""
                messages.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id")),
                                 "content": text})
            elif kind == "thinking" and \
                    block.get("signature") != sign(str(block.get("thinking", ""))):
                return [], (f"messages.{len(messages)}.content: Invalid `signature` in "
                                "`thinking` block (fake)")
            # redacted_thinking, server tools: nothing the fake answers
        if calls:
            messages.append({"role": "assistant", "content": _text_or_parts(parts) or None,
                             "tool_calls": calls})
        elif parts:
            messages.append({"role": role, "content": _text_or_parts(parts)})
    return messages, None


def offered(body: Mapping[str, Any]) -> list[str]:
    tools = body.get("tools")
    return [str(t["name"]) for t in tools if isinstance(t, Mapping) and "name" in t
            and "input_schema" in t] if isinstance(tools, list) else []


def wants_thinking(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}


class Output:
    """One reply's content blocks, built once for the body and the stream."""

    def __init__(self, mid: str, reply: Any, body: Mapping[str, Any], thought: str) -> None:
        self.mid, self.reply = mid, reply
        self.blocks: list[dict[str, Any]] = []
        if wants_thinking(body):
            self.blocks.append({"type": "thinking", "thinking": thought,
                                "signature": sign(thought)})
        text = "".join(reply.chunks)
        if text or not reply.calls:
            self.blocks.append({"type": "text", "text": text})
        for call in reply.calls:
            self.blocks.append({"type": "tool_use", "id": call["id"],
                                "name": call["function"]["name"],
                                "input": _input(call["function"]["arguments"])})

    def usage(self, output: int | None = None) -> dict[str, Any]:
        u = self.reply.usage
        return {"input_tokens": u["prompt_tokens"], "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": u["completion_tokens"] if output is None else output}

    def message(self, content: list[dict[str, Any]] | None = None,
                stop: str | None = None) -> dict[str, Any]:
        return {"id": self.mid, "type": "message", "role": "assistant", "model": self.reply.model,
                "content": self.blocks if content is None else content,
                "stop_reason": stop, "stop_sequence": None,
                "usage": self.usage(None if content is None else 1)}


def message_body(out: Output) -> dict[str, Any]:
    return out.message(stop=STOP_REASONS.get(out.reply.finish, "end_turn"))


def events(out: Output, arg_chunk: int) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(event type, payload, whether it carries reply text) for the whole stream."""
    yield "message_start", {"type": "message_start", "message": out.message([])}, False
    yield "ping", {"type": "ping"}, False
    for index, block in enumerate(out.blocks):
        kind = block["type"]
        start = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                 "text": {"type": "text", "text": ""},
                 "tool_use": {**block, "input": {}}}[kind]
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": start}, False
        if kind == "thinking":
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                "type": "thinking_delta", "thinking": block["thinking"]}}, False
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                "type": "signature_delta", "signature": block["signature"]}}, False
        elif kind == "text":
            for piece in out.reply.chunks:
                yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "text_delta", "text": piece}}, True
        else:
            arguments = json.dumps(block["input"])
            step = arg_chunk if arg_chunk > 0 else max(len(arguments), 1)
            for at in range(0, len(arguments), step):
                yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta",
                                                        "partial_json": arguments[at:at + step]}
                                              }, False
        yield "content_block_stop", {"type": "content_block_stop", "index": index}, False
    yield "message_delta", {"type": "message_delta", "delta": {
        "stop_reason": STOP_REASONS.get(out.reply.finish, "end_turn"), "stop_sequence": None},
        "usage": {"output_tokens": out.reply.usage["completion_tokens"]}}, False
    yield "message_stop", {"type": "message_stop"}, False
