"""Which conversation a request names, by every means a client has of naming one.

In order: the ``X-Chatstate-Conversation`` header; the base URL
(``http://HOST:PORT/c/<id>/v1``, for clients that take a base URL and nothing else);
``metadata.chatstate_conversation`` or ``metadata.conversation_id`` in the body; a
``user`` field of the form ``chatstate:<id>``. Chatstate's own fields are taken out
of the body before it goes upstream (a ``user`` of any other form is the client's
and passes through untouched). With none of them, the history decides
(``_history.HistoryIndex``), within the caller's namespace.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from chatstate.core.canonical import canonical_json
from chatstate.core.transcript import validate_id
from chatstate.serve._auth import keyed_digest
from chatstate.serve._wire import CONVERSATION_HEADER

USER_PREFIX = "chatstate:"
METADATA_KEYS = ("chatstate_conversation", "conversation_id")
IDEMPOTENCY_HEADER = "idempotency-key"
_PATH = re.compile(r"^/c/([^/]+)(/v1(?:/.*)?)$")


class ConversationPath:
    """ASGI middleware: ``/c/<id>/v1/...`` is ``/v1/...`` naming conversation ``<id>``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            match = _PATH.match(scope["path"])
            if match:
                scope = {**scope, "path": match.group(2),
                         "raw_path": match.group(2).encode(),
                         "state": {**scope.get("state", {}),
                                   "path_conversation": match.group(1)}}
        await self.app(scope, receive, send)


def conversation_id(request: Request, data: Mapping[str, Any]) -> str | None:
    """The id the request names, validated (InvalidConversationId), or None."""
    cid = request.headers.get(CONVERSATION_HEADER)
    if cid is None:
        cid = request.scope.get("state", {}).get("path_conversation")
    metadata = data.get("metadata")
    if cid is None and isinstance(metadata, dict):
        cid = next((metadata[k] for k in METADATA_KEYS if isinstance(metadata.get(k), str)),
                   None)
    user = data.get("user")
    if cid is None and isinstance(user, str) and user.startswith(USER_PREFIX):
        cid = user[len(USER_PREFIX):]
    return None if cid is None else validate_id(cid)


def forward_body(data: Mapping[str, Any]) -> dict[str, Any]:
    """The request as the client sent it, less chatstate's own routing fields."""
    forward = dict(data)
    metadata = forward.get("metadata")
    if isinstance(metadata, dict) and any(k in metadata for k in METADATA_KEYS):
        rest = {k: v for k, v in metadata.items() if k not in METADATA_KEYS}
        if rest:
            forward["metadata"] = rest
        else:
            del forward["metadata"]
    user = forward.get("user")
    if isinstance(user, str) and user.startswith(USER_PREFIX):
        del forward["user"]
    return forward


def request_key(request: Request, namespace: str, forward: Mapping[str, Any],
                cid: str | None) -> str:
    """What makes two requests "the same request": the client's ``Idempotency-Key``, else
    the body (and the conversation it names), within one namespace. A keyed digest:
    it is stored with the request's message (``_auth.keyed_digest``)."""
    given = request.headers.get(IDEMPOTENCY_HEADER)
    material = "key:" + given if given else "body:" + canonical_json(
        {"conversation": cid, "body": dict(forward)})
    return keyed_digest("request", f"{namespace}\n{material}")
