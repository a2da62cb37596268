"""``/v1/chatstate/conversations[/{id}]``: what a client stored, and only its own.

``GET`` lists the caller's conversations, newest first, a page at a time
(``limit``, default 100, at most 1000; ``after``: the last id of the previous
page; ``has_more`` says whether there is another), and with ``q=`` only those with
a message containing the text (on stores that search: sqlite, postgresql).
``GET /{id}`` is the conversation as ``replay --format json`` shows it (with
``?requests=true``: the requests its turns made, as ``replay --requests --format
json`` shows them, ``chatstate.ops.request_log``); ``DELETE
/{id}`` removes it, as ``chatstate rm`` does, and logs it. A conversation of
another namespace is a 404, like one that does not exist.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chatstate.core.transcript import ConversationSummary, validate_id
from chatstate.errors import (
    ChatstateError,
    ConversationNotFound,
    InvalidConversationId,
    Unsupported,
)
from chatstate.serve._history import HistoryIndex, namespace_of
from chatstate.serve._wire import openai_error
from chatstate.stores.base import Searchable, Store

log = logging.getLogger("chatstate.serve")

MAX_PAGE = 1000


class Conversations:
    def __init__(self, store: Store, index: HistoryIndex) -> None:
        self.store, self.index = store, index

    def _namespace(self, conversation_id: str) -> str | None:
        """The namespace of a stored conversation (loaded once when not indexed)."""
        known = self.index.namespace(conversation_id)
        if known is not None:
            return known
        try:
            conv = self.store.load(conversation_id)
        except ChatstateError as exc:  # gone, or damaged: shown to no client
            log.warning("serve: not listing %s: %s", conversation_id, exc)
            return None
        self.index.note(namespace_of(conv), conv)
        return namespace_of(conv)

    def _rows(self, namespace: str, q: str | None, limit: int, after: str | None
              ) -> tuple[list[ConversationSummary], bool]:
        rows = self.store.list_conversations()
        if q is not None:
            assert isinstance(self.store, Searchable)
            hits = {cid for cid, _, _ in self.store.search(q, limit=10_000)}
            rows = [r for r in rows if r.id in hits]
        if after is not None:
            ids = [r.id for r in rows]
            rows = rows[ids.index(after) + 1:] if after in ids else []
        page: list[ConversationSummary] = []
        for row in rows:
            if self._namespace(row.id) != namespace:
                continue
            if len(page) == limit:
                return page, True
            page.append(row)
        return page, False

    async def page(self, request: Request) -> Response:
        params = request.query_params
        try:
            limit = int(params.get("limit", "100"))
        except ValueError:
            limit = -1
        if not 1 <= limit <= MAX_PAGE:
            return openai_error(400, f"limit must be a whole number from 1 to {MAX_PAGE}")
        q = params.get("q")
        if q is not None and not isinstance(self.store, Searchable):
            return openai_error(400, f"this store ({type(self.store).__name__}) has no "
                                "search: leave q= out, or use a sqlite or postgresql store")
        try:
            rows, more = await asyncio.to_thread(self._rows, request.state.namespace, q, limit,
                                                 params.get("after"))
        except Unsupported:  # search on an encrypted store: off (the store URL stays hidden)
            return openai_error(400, "this store is encrypted: full-text search is off (an "
                                "index would keep every word in the clear); leave q= out, "
                                "or start serve with CHATSTATE_ENCRYPTED_SEARCH=keyed for a "
                                "keyed index (see docs/encryption.md for what it reveals)")
        return JSONResponse({"object": "list", "data": [r.model_dump() for r in rows],
                             "has_more": more,
                             "first_id": rows[0].id if rows else None,
                             "last_id": rows[-1].id if rows else None})

    async def one(self, request: Request) -> Response:
        from chatstate.ops.transfer import render

        try:
            cid = validate_id(request.path_params["cid"])
            conv = await asyncio.to_thread(self.store.load, cid)
        except InvalidConversationId as exc:
            return openai_error(400, str(exc))
        except ConversationNotFound:
            return openai_error(404, "no such conversation", "not_found")
        except ChatstateError as exc:
            return openai_error(500, str(exc), "storage_error")
        if namespace_of(conv) != request.state.namespace:
            return openai_error(404, "no such conversation", "not_found")
        if request.method == "DELETE":
            try:
                await asyncio.to_thread(self.store.delete, cid)
            except ConversationNotFound:
                return openai_error(404, "no such conversation", "not_found")
            self.index.forget(cid)
            log.info("serve: deleted conversation %s (%d messages)", cid, len(conv.messages))
            return JSONResponse({"id": cid, "object": "chatstate.conversation.deleted",
                                 "deleted": True})
        if request.query_params.get("requests") in ("1", "true"):
            from chatstate.ops.request_log import requests_of

            rows = await asyncio.to_thread(requests_of, conv)
            return JSONResponse({"object": "list", "data": rows})
        return Response(await asyncio.to_thread(render, conv, "json"),
                        media_type="application/json")
