"""Every error ``chatstate serve`` answers is JSON in its API's shape.

``{"error": {"message", "type", "param", "code"}}``, as the OpenAI API answers (and
Anthropic's ``{"type": "error", "error": {...}}`` on ``/v1/messages``), so a
client's SDK raises its usual exception with the message in it: the proxy's own
refusals, a route or method it does not have (404/405), an unexpected exception
(500), and a stream that failed after it began (an ``error`` event, ``stream_error``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

log = logging.getLogger("chatstate.serve")


def error_body(message: str, kind: str = "invalid_request_error", *, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_error(status: int, message: str, kind: str = "invalid_request_error", *,
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An OpenAI-shaped error response (``code`` defaults to the type for the proxy's own
    kinds, as OpenAI's ``rate_limit_exceeded`` or ``model_not_found`` do)."""
    return JSONResponse(error_body(message, kind, param=param, code=code),
                        status_code=status, headers=dict(headers or {}))


def anthropic_path(path: str) -> bool:
    """A route of the Anthropic Messages API (``/v1/messages``, its ``count_tokens``)."""
    return path.rstrip("/").endswith("/v1/messages") or "/v1/messages/" in path


def error_for(path: str, status: int, message: str, kind: str = "invalid_request_error", *,
              param: str | None = None, code: str | None = None,
              headers: Mapping[str, str] | None = None) -> JSONResponse:
    """``openai_error``, or Anthropic's shape on its routes: the proxy's own refusals
    (401, 413, 415, 421, 404, 500) in the shape the client's SDK reads."""
    if anthropic_path(path):
        from chatstate.serve._messages import anthropic_error

        made = anthropic_error(status, message, kind, param=param, code=code, headers=headers)
        assert isinstance(made, JSONResponse)
        return made
    return openai_error(status, message, kind, param=param, code=code, headers=headers)


def stream_error(message: str, code: str = "upstream_error") -> bytes:
    """The server-sent event that ends a stream which failed after it began: the openai
    SDK raises ``APIError`` with ``message`` on it (llm, LangChain and the rest with it)."""
    body = error_body(message, "upstream_error", code=code)
    return f"data: {json.dumps(body)}\n\n".encode()


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404 (no route) and 405 (no such method on a route), as OpenAI's."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    where = f"{request.method} {path}"
    if exc.status_code == 404:
        return error_for(path, 404, f"no route {where}: chatstate serve answers /v1/chat/"
                         "completions, /v1/responses, /v1/messages[/count_tokens], "
                         "/v1/models[/{id}], /v1/embeddings, /v1/completions and "
                         "/v1/chatstate/conversations", code="unknown_url")
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        return error_for(path, 405, f"method not allowed: {where} (allowed: {allowed})",
                         code="method_not_allowed", headers=exc.headers)
    return error_for(path, exc.status_code, f"{where}: {exc.detail}", headers=exc.headers)


async def server_error(request: Request, exc: Exception) -> Response:
    """An unexpected exception: a JSON 500 that names the request (the traceback is in
    the log, not the answer)."""
    log.error("serve: %s %s failed: %s: %s", request.method, request.url.path,
              type(exc).__name__, exc)
    return error_for(request.url.path, 500, f"chatstate serve failed on {request.method} "
                     f"{request.url.path} ({type(exc).__name__}); see its log",
                     "server_error", code="internal_error")


EXCEPTION_HANDLERS: dict[Any, Any] = {404: http_error, 405: http_error, Exception: server_error}
"""For ``Starlette(exception_handlers=...)``."""
