"""The HTTP side of a proxied request: reading and checking it, what goes upstream,
what comes back, and OpenAI-shaped errors. No store and no state here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx2
from starlette.requests import Request
from starlette.responses import Response

from chatstate.adapter.dialects.chat_completions import parse_usage
from chatstate.core.redact import scrub
from chatstate.serve._errors import error_for, openai_error
from chatstate.serve._history import ROLES

__all__ = ["CONVERSATION_HEADER", "bearer", "check_request", "kept_headers", "one_choice",
           "openai_error", "passthrough", "read_body", "reply_fields", "upstream_error"]

CONVERSATION_HEADER = "X-Chatstate-Conversation"


def bearer(header: str) -> str:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def read_body(request: Request, limit: int) -> bytes | Response:
    path = request.url.path
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return error_for(path, 413, f"request body over the {limit} byte limit (--max-body)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return error_for(path, 413, f"request body over the {limit} byte limit "
                             "(--max-body)")
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


def one_choice(data: Mapping[str, Any]) -> str | None:
    """Why a request asking for more than one choice is refused, or None.

    A turn stores one reply: storing ``n`` choices as one would mix them, keeping the
    first would drop the rest silently. So ``n>1`` is a 400 before anything is stored.
    """
    n = data.get("n")
    if isinstance(n, int | float) and not isinstance(n, bool) and n > 1:
        return (f"n={n:g}: chatstate serve stores one reply per turn, so it answers n=1 "
                "only; send n=1 (or leave n out) and repeat the request for more answers")
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


def kept_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream's response headers a client may see (not hop-by-hop, no cookies)."""
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP
            and not k.lower().startswith("set-cookie")}


def passthrough(resp: httpx2.Response, headers: Mapping[str, str]) -> Response:
    kept = kept_headers(resp.headers)
    return Response(resp.content, resp.status_code, headers={**kept, **headers})


def upstream_error(content: bytes, status: int, headers: Mapping[str, str],
                   upstream_headers: Mapping[str, str], *secrets: str | None
                   ) -> tuple[str, Response]:
    """An upstream error body through the one redactor: (what is stored, what is relayed).

    Providers echo the key in a 401; the redacted text keeps JSON valid (a key inside a
    string becomes ``[redacted]``), so the client still gets the provider's error shape.
    """
    text = scrub(content.decode("utf-8", "replace"), *secrets, limit=None)
    kept = kept_headers(upstream_headers)
    return text, Response(text.encode(), status, headers={**kept, **headers})
