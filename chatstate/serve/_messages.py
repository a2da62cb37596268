"""``POST /v1/messages`` through serve: the Anthropic Messages API, persisted first.

The request is read into the stored (chat-completions) form: the top-level
``system`` (and any ``role: "system"`` message, as Claude Code sends) is a
system message, text/image/document blocks are chatstate parts (text blocks
with ``cache_control`` markers are stored as plain text: the markers move from
turn to turn and would fork the history every time), ``tool_use`` blocks the
assistant's tool calls, ``tool_result`` blocks ``tool`` messages, and thinking
blocks ride on their assistant message (``extra["thinking_blocks"]``, kept
exactly as sent, signature and all), as a server tool's blocks do
(``extra["server_blocks"]``: ``server_tool_use``, ``web_search_tool_result``, ...).
Then it is the same turn as a chat completion (``app.Proxy._chat``); the upstream's
events (``message_start``, ``content_block_*``, ``message_delta``, ``message_stop``,
``ping``, ``error``) are relayed with their names. Errors are Anthropic-shaped, a
stream that fails mid-way too (``_stream_events``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from chatstate.adapter.dialects.anthropic_messages import (
    ANTHROPIC_MESSAGES,
    VERSION,
    MessagesStream,
    parse_message,
)
from chatstate.core.transcript import Message
from chatstate.serve._replay import REPLAYED_HEADER
from chatstate.serve._stream_events import AnthropicEvents, anthropic_kind
from chatstate.serve._wires import Wire, stored_reply

__all__ = ["MESSAGES_WIRE", "anthropic_error", "request_messages"]

_STOP = {"length": "max_tokens", "content_filter": "refusal", "tool_calls": "tool_use"}


def anthropic_error(status: int, message: str, kind: str = "", *, param: str | None = None,
                    code: str | None = None,
                    headers: Mapping[str, str] | None = None) -> Response:
    """An error in Anthropic's shape; chatstate's own kind is kept as ``error.code`` (the
    same arguments as ``openai_error``, so a turn answers either way)."""
    error: dict[str, Any] = {"type": anthropic_kind(status), "message": message}
    if kind or code:
        error["code"] = code or kind
    if param:
        error["param"] = param
    return JSONResponse({"type": "error", "error": error}, status_code=status,
                        headers=dict(headers) if headers else None)


def _part(block: Mapping[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    if kind in ("image", "document"):
        source = block.get("source") if isinstance(block.get("source"), Mapping) else {}
        assert isinstance(source, Mapping)
        if source.get("type") not in ("base64", "url"):
            # a file id, a plain-text or content-block document: no chatstate part holds
            # it, so it is kept as sent (it was stored as an empty url or file_data)
            return {k: v for k, v in block.items() if k != "cache_control"}
        url = f"data:{source.get('media_type')};base64,{source.get('data')}" \
            if source.get("type") == "base64" else str(source.get("url", ""))
        if kind == "image":
            return {"type": "image_url", "image_url": {"url": url}}
        inner: dict[str, Any] = {"file_data": url}
        if block.get("title"):
            inner["filename"] = block["title"]
        return {"type": "file", "file": inner}
    return {k: v for k, v in block.items() if k != "cache_control"}


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p.get("type") == "text" for p in parts):
        return "".join(str(p.get("text", "")) for p in parts)
    return parts


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(b.get("text", "")) for b in value if isinstance(b, Mapping))
    return ""


def _blocks(value: object) -> str | list[dict[str, Any]]:
    """A tool result's content: its text, or its parts when it holds more than text (an
    image a tool returned was dropped)."""
    if isinstance(value, list):
        return _content([_part(b) for b in value if isinstance(b, Mapping)])
    return _text(value)


def request_messages(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The stored-form messages of an Anthropic request (ValueError if misshapen)."""
    out: list[dict[str, Any]] = []
    system = _text(data.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    given = data.get("messages")
    if not isinstance(given, list) or not given:
        raise ValueError("'messages' must be a non-empty list")
    for i, message in enumerate(given):
        if not isinstance(message, Mapping) or message.get("role") not in (
                "user", "assistant", "system"):
            raise ValueError(f"messages[{i}] needs a role, one of user, assistant")
        role, content = str(message["role"]), message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise ValueError(f"messages[{i}].content must be a string or a list of blocks")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        thinking: list[dict[str, Any]] = []
        server: list[dict[str, Any]] = []  # a server tool's blocks, as the reply stored them
        for block in content:
            kind = block.get("type") if isinstance(block, Mapping) else None
            if not isinstance(block, Mapping):
                raise ValueError(f"messages[{i}].content holds a block that is not an object")
            if kind == "tool_use":
                calls.append({"id": str(block.get("id")), "type": "function", "function": {
                    "name": str(block.get("name")),
                    "arguments": json.dumps(block.get("input") or {})}})
            elif kind == "tool_result":
                result: dict[str, Any] = {"role": "tool",
                                          "tool_call_id": str(block.get("tool_use_id")),
                                          "content": _blocks(block.get("content", ""))}
                if block.get("is_error"):
                    result["is_error"] = True
                out.append(result)
            elif kind in ("thinking", "redacted_thinking"):
                thinking.append(dict(block))
            elif role == "assistant" and kind not in ("text", "image", "document"):
                server.append(dict(block))
            else:
                parts.append(_part(block))
        if role == "assistant" and (parts or calls or thinking or server):
            reply: dict[str, Any] = {"role": "assistant", "content": _content(parts)}
            if calls:
                reply["tool_calls"] = calls
            if thinking:
                reply["thinking_blocks"] = thinking
            if server:
                reply["server_blocks"] = server
            out.append(reply)
        elif parts:
            out.append({"role": role, "content": _content(parts)})
    return out


def _fields(data: object) -> dict[str, Any]:
    try:
        return stored_reply(parse_message(data))
    except Exception as exc:  # AttemptFailed: a misshapen reply or an error object
        raise ValueError(str(exc)) from exc


def _holds(event: object) -> bool:
    return isinstance(event, Mapping) and event.get("type") == "content_block_start" and \
        isinstance(event.get("content_block"), Mapping) and \
        event["content_block"].get("type") == "tool_use"


def message_object(reply: Message) -> dict[str, Any]:
    """A stored reply as an Anthropic message (for a replayed request)."""
    blocks: list[dict[str, Any]] = [dict(b) for b in (reply.extra or {}).get(
        "thinking_blocks") or ()]
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    for call in reply.tool_calls or ():
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                       "input": arguments})
    usage = reply.usage or {}
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    return {"id": f"msg_{reply.turn_id}", "type": "message", "role": "assistant",
            "model": reply.model or "", "content": blocks,
            "stop_reason": _STOP.get(finish, "end_turn"), "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0),
                      "output_tokens": usage.get("completion_tokens", 0)}}


def stream_events(body: dict[str, Any]) -> Iterator[bytes]:
    def ev(kind: str, **fields: Any) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()

    yield ev("message_start", message={**body, "content": [], "stop_reason": None})
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            yield ev("content_block_start", index=index,
                     content_block={"type": "text", "text": ""})
            yield ev("content_block_delta", index=index,
                     delta={"type": "text_delta", "text": block["text"]})
        elif block["type"] == "tool_use":
            yield ev("content_block_start", index=index, content_block={**block, "input": {}})
            yield ev("content_block_delta", index=index, delta={
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])})
        elif block["type"] == "thinking":
            yield ev("content_block_start", index=index,
                     content_block={"type": "thinking", "thinking": "", "signature": ""})
            yield ev("content_block_delta", index=index,
                     delta={"type": "thinking_delta", "thinking": block["thinking"]})
            yield ev("content_block_delta", index=index,
                     delta={"type": "signature_delta", "signature": block["signature"]})
        else:
            yield ev("content_block_start", index=index, content_block=block)
        yield ev("content_block_stop", index=index)
    yield ev("message_delta", delta={"stop_reason": body["stop_reason"], "stop_sequence": None},
             usage={"output_tokens": body["usage"]["output_tokens"]})
    yield ev("message_stop")


def replay(reply: Message, stream: bool, headers: dict[str, str]) -> Response:
    headers = {**headers, REPLAYED_HEADER: "true"}
    body = message_object(reply)
    if stream:
        return StreamingResponse(stream_events(body), headers=headers,
                                 media_type="text/event-stream")
    return JSONResponse(body, headers=headers)


def _key_headers(api_key: str) -> dict[str, str]:
    return {"x-api-key": api_key}


MESSAGES_WIRE = Wire("anthropic_messages", ANTHROPIC_MESSAGES.path, request_messages,
                     anthropic_error, _fields, replay, decoder=MessagesStream, holds=_holds,
                     named=True, key_headers=_key_headers, failures=AnthropicEvents,
                     passed_headers=("anthropic-version", "anthropic-beta"))
DEFAULT_VERSION = {"anthropic-version": VERSION}
