"""The HTTP side of a proxied request: reading and checking it, what goes upstream,
what comes back, and OpenAI-shaped errors. No store and no state here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx2
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chatstate.adapter.dialects.chat_completions import parse_usage
from chatstate.serve._history import ROLES

CONVERSATION_HEADER = "X-Chatstate-Conversation"


def openai_error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def bearer(header: str) -> str:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def read_body(request: Request, limit: int) -> bytes | Response:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return openai_error(413, f"request body over the {limit} byte limit (--max-body)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return openai_error(413, f"request body over the {limit} byte limit (--max-body)")
        chunks.append(chunk)
    return b"".join(chunks)


def check_request(data: object) -> str | None:
    if not isinstance(data, dict):
        return "the request body must be a JSON object"
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return f"messages[{i}] needs a role, one of {', '.join(ROLES)}"
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            return f"messages[{i}].content must be a string or a list of parts"
    return None


def reply_fields(data: object) -> dict[str, Any]:
    """The stored form of a non-streamed chat completion's first choice."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or \
            not data["choices"] or not isinstance(data["choices"][0].get("message"), dict):
        raise ValueError("no choices[0].message")
    message = data["choices"][0]["message"]
    extra = {k: v for k, v in message.items()
             if k not in ("role", "content", "tool_calls") and v is not None}
    fields: dict[str, Any] = {"content": message.get("content") or "",
                              "model": data.get("model"), "usage": parse_usage(data.get("usage"))}
    if message.get("tool_calls"):
        fields["tool_calls"] = message["tool_calls"]
    if extra:
        fields["extra"] = extra
    finish = data["choices"][0].get("finish_reason")
    if finish not in (None, "stop", "tool_calls"):
        fields["finish_reason"] = finish
    return fields


_HOP_BY_HOP = {"server", "date", "connection", "keep-alive", "transfer-encoding", "content-length",
               "content-encoding", "upgrade", "proxy-authenticate", "te", "trailer"}


def passthrough(resp: httpx2.Response, headers: Mapping[str, str]) -> Response:
    kept = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP_BY_HOP
            and not k.lower().startswith("set-cookie")}
    return Response(resp.content, resp.status_code, headers={**kept, **headers})
