"""The stored reply of a request seen before, as the chat completion the client asked for.

A retried request (the SDK's own retries, a client re-sending after the proxy was
killed) gets the turn it already has, plain or streamed, marked with
``X-Chatstate-Replayed: true``; nothing is stored and nothing goes upstream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from chatstate.core.transcript import Message

REPLAYED_HEADER = "X-Chatstate-Replayed"


def _message(reply: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        out["tool_calls"] = reply.tool_calls
        if reply.content == "":
            out["content"] = None
    for key, value in (reply.extra or {}).items():
        out.setdefault(key, value)
    return out


def _finish(reply: Message) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def _usage(reply: Message) -> dict[str, Any] | None:
    return dict(reply.usage) if reply.usage is not None else None


def completion(reply: Message) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": f"chatcmpl-{reply.turn_id}", "object": "chat.completion",
        "created": int(time.time()), "model": reply.model or "",
        "choices": [{"index": 0, "message": _message(reply), "finish_reason": _finish(reply)}]}
    usage = _usage(reply)
    if usage is not None:
        body["usage"] = usage
    return body


def _chunks(reply: Message) -> Iterator[bytes]:
    base = {"id": f"chatcmpl-{reply.turn_id}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": reply.model or ""}
    delta: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(reply.tool_calls)]
    last: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": {},
                                                 "finish_reason": _finish(reply)}]}
    usage = _usage(reply)
    if usage is not None:
        last["usage"] = usage
    for event in ({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  last):
        yield f"data: {json.dumps(event)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def replay_response(reply: Message, stream: bool, headers: dict[str, str]) -> Response:
    headers = {**headers, REPLAYED_HEADER: "true"}
    if stream:
        return StreamingResponse(_chunks(reply), headers=headers,
                                 media_type="text/event-stream")
    return JSONResponse(completion(reply), headers=headers)
