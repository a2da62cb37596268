"""The web view's routes: the list, a conversation, its exports and blobs, usage."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from chatstate.core.content import parse_data_url
from chatstate.core.transcript import Conversation, validate_id
from chatstate.errors import ChatstateError, ConversationNotFound, InvalidConversationId
from chatstate.ops import usage as usage_ops
from chatstate.stores.base import BlobStore, Store
from chatstate.stores.forwarding import ForwardingStore
from chatstate.web import _chart, _conversation, _markdown
from chatstate.web._catalogue import Catalogue, Filters, namespace_of
from chatstate.web._guard import BLOB_CSP, Guard

HERE = Path(__file__).parent
EXPORTS = {"chatstate": ("json", "application/json"), "openai": ("openai.json",
                                                                 "application/json"),
           "jsonl": ("jsonl", "application/x-ndjson"), "markdown": ("md", "text/markdown"),
           "text": ("txt", "text/plain")}
Namespace = Callable[[Request], "str | None"]


@dataclass
class WebConfig:
    store: Store
    host_allowed: Callable[[str], bool]
    namespace: Namespace | None = None
    """The caller's namespace ("": the default one), None: not authorized. Not given: the
    local store's owner, who sees every conversation (``chatstate web``)."""
    prices: dict[str, tuple[float, float]] | None = None
    title: str = "chatstate"
    extra: dict[str, Any] = field(default_factory=dict)


class _Scoped(ForwardingStore):
    """The store as one namespace sees it, for ``usage.collect``: its conversations only."""

    def __init__(self, inner: Store, rows: Catalogue, namespace: str) -> None:
        super().__init__(inner)
        self._catalogue, self._namespace = rows, namespace

    def list_conversations(self, limit: int | None = None) -> list[Any]:
        out = [s for s in self.inner.list_conversations()
               if (row := self._catalogue.row(s)) is not None and row.damaged is None
               and row.namespace == self._namespace]
        return out[:limit] if limit is not None else out


class WebView:
    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self.store = config.store
        self.catalogue = Catalogue(config.store)
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                                      autoescape=True, undefined=jinja2.StrictUndefined)
        self.css = (HERE / "static" / "web.css").read_text() + "\n" + _markdown.highlight_css()
        self.icon = (HERE / "static" / "favicon.svg").read_bytes()

    def warm(self) -> None:
        """Compile the templates and load the Markdown and highlighting code now, so the
        first page is not the slow one (``chatstate web`` calls it before listening)."""
        for name in ("list.html", "conversation.html", "usage.html", "error.html",
                     "damaged.html"):
            self.env.get_template(name)
        _markdown.render("*warm* `up`\n\n```python\nx = 1\n```\n")

    # -- helpers -----------------------------------------------------------------------
    def _html(self, request: Request, template: str, status: int = 200, **values: Any
              ) -> Response:
        base = request.scope.get("root_path", "")
        page = self.env.get_template(template).render(
            base=base, title=self.config.title, scoped=self.config.namespace is not None,
            encrypted=_encrypted(self.store), **values)
        return HTMLResponse(page, status_code=status)

    def _error(self, request: Request, status: int, text: str) -> Response:
        return self._html(request, "error.html", status, status_code=status, message=text)

    def _namespace(self, request: Request) -> str | None:
        ns: str | None = request.state.namespace
        return ns

    async def _load(self, request: Request) -> Conversation | Response:
        """The conversation the path names, if the caller may see it."""
        try:
            cid = validate_id(request.path_params["cid"])
            conv = await asyncio.to_thread(self.store.load, cid)
        except InvalidConversationId as exc:
            return self._error(request, 400, str(exc))
        except ConversationNotFound:
            return self._error(request, 404, "no such conversation")
        except ChatstateError as exc:
            return self._error(request, 500, f"the conversation does not load: {exc}")
        ns = self._namespace(request)
        if ns is not None and namespace_of(conv) != ns:
            return self._error(request, 404, "no such conversation")
        return conv

    # -- pages ---------------------------------------------------------------------------
    async def css_file(self, request: Request) -> Response:
        return Response(self.css, media_type="text/css")

    async def icon_file(self, request: Request) -> Response:
        return Response(self.icon, media_type="image/svg+xml")

    async def list_page(self, request: Request) -> Response:
        params = request.query_params
        q = params.get("q") or None
        if q is not None and not self.catalogue.searchable:
            return self._error(request, 400, f"this store ({type(self.store).__name__}) has "
                               "no full-text search: leave the search out, or use a sqlite "
                               "or postgresql store")
        try:
            page = max(1, int(params.get("page", "1")))
            since, until = (_day(params.get(k)) for k in ("since", "until"))
        except ValueError:
            return self._error(request, 400, "page must be a whole number and since/until "
                               "dates (YYYY-MM-DD)")
        filters = Filters(q=q, model=params.get("model") or None, since=since, until=until)
        namespace = self._namespace(request)
        rows, more = await asyncio.to_thread(self.catalogue.page, filters, namespace, page)
        return self._html(request, "list.html", rows=rows, more=more, page=page,
                          filters=filters, models=self.catalogue.models(namespace),
                          searchable=self.catalogue.searchable,
                          query=_query(params, page=None))

    async def conversation_page(self, request: Request) -> Response:
        cid = request.path_params["cid"]
        try:
            validate_id(cid)
            page = max(1, int(request.query_params.get("page", "1")))
        except (InvalidConversationId, ValueError) as exc:
            return self._error(request, 400, str(exc))
        ns = self._namespace(request)
        try:
            conv, verdict = await asyncio.to_thread(_conversation.verify, self.store, cid)
        except ConversationNotFound:
            return self._error(request, 404, "no such conversation")
        except ChatstateError as exc:
            return self._error(request, 500, f"the conversation does not load: {exc}")
        if conv is None:  # damaged (its namespace is unknown: shown to the local owner)
            if ns is None:
                return self._html(request, "damaged.html", 200, cid=cid, verdict=verdict)
            return self._error(request, 404, "no such conversation")
        if ns is not None and namespace_of(conv) != ns:
            return self._error(request, 404, "no such conversation")
        base = request.scope.get("root_path", "") + f"/c/{cid}"
        view = await asyncio.to_thread(_conversation.build, conv, base, page,
                                      verdict.bad_blobs)
        children = await asyncio.to_thread(self.catalogue.children, conv, ns)
        origin = conv.metadata.get("forked_from")
        return self._html(request, "conversation.html", view=view, conv=conv,
                          verdict=verdict, children=children,
                          parent=origin if isinstance(origin, dict) else None,
                          exports=list(EXPORTS))

    async def export(self, request: Request) -> Response:
        from chatstate.ops.transfer import export_json, export_openai, render

        fmt = request.path_params["fmt"]
        if fmt not in EXPORTS:
            return self._error(request, 404, f"no export format {fmt!r}: one of "
                               f"{', '.join(EXPORTS)}")
        conv = await self._load(request)
        if isinstance(conv, Response):
            return conv

        def text() -> str:
            if fmt == "chatstate":
                return export_json(conv, self.store)
            if fmt in ("openai", "jsonl"):
                return export_openai(conv, self.store, jsonl=fmt == "jsonl")
            return render(conv, fmt)

        try:
            body = await asyncio.to_thread(text)
        except ChatstateError as exc:
            return self._error(request, 500, f"the export failed: {exc}")
        ext, media = EXPORTS[fmt]
        return Response(body, media_type=media, headers={
            "Content-Disposition": f'attachment; filename="{conv.id}.{ext}"'})

    async def blob(self, request: Request) -> Response:
        conv = await self._load(request)
        if isinstance(conv, Response):
            return conv
        sha = request.path_params["sha"]
        refs = [r for m in [*conv.messages, *([conv.partial] if conv.partial else [])]
                for r in m.blob_refs() if r.get("sha256") == sha]
        if not refs or not isinstance(self.store, BlobStore):
            return self._error(request, 404, "this conversation names no such blob")
        blobs: BlobStore = self.store
        try:
            data = await asyncio.to_thread(blobs.get_blob, sha)
        except ChatstateError as exc:
            return self._error(request, 500, f"the blob does not read: {exc}")
        return _bytes(data, str(refs[0].get("media_type") or ""),
                      str(refs[0].get("name") or sha[:16]))

    async def part(self, request: Request) -> Response:
        """An inline (data URL) image or file of a message, as bytes."""
        conv = await self._load(request)
        if isinstance(conv, Response):
            return conv
        label, index = request.path_params["label"], request.path_params["index"]
        if label == "partial":
            msg = conv.partial
        else:
            seq = int(label) if label.isdigit() else -1
            msg = conv.messages[seq] if 0 <= seq < len(conv.messages) else None
        content = msg.content if msg is not None else ""
        part = content[index] if isinstance(content, list) and index < len(content) else None
        kind = str(part.get("type")) if part else ""
        inner = part.get(kind) if part else None
        url = inner.get("url") or inner.get("file_data") if isinstance(inner, dict) else None
        if not isinstance(url, str) or not url.startswith("data:"):
            return self._error(request, 404, "no inline data at this part")
        try:
            data, media = parse_data_url(url)
        except (ChatstateError, binascii.Error):
            return self._error(request, 400, "the part's data URL is not valid base64")
        name = str((part or {}).get("name") or (inner or {}).get("filename") or
                   f"{conv.id}-{label}-{index}")
        return _bytes(data, media, name)

    async def usage_page(self, request: Request) -> Response:
        try:
            since_day = _day(request.query_params.get("since"))
        except ValueError:
            return self._error(request, 400, "since must be a date (YYYY-MM-DD)")
        since = usage_ops.parse_since(since_day) if since_day else None
        ns = self._namespace(request)
        store: Store = self.store if ns is None else _Scoped(self.store, self.catalogue, ns)

        def collect() -> tuple[usage_ops.Report, usage_ops.Report]:
            return (usage_ops.collect(store, by="day", since=since, prices=self.config.prices),
                    usage_ops.collect(store, by="model", since=since,
                                      prices=self.config.prices))

        days, models = await asyncio.to_thread(collect)
        return self._html(request, "usage.html", days=days, models=models,
                          chart=_chart.bars(days.rows), since=since_day or "",
                          priced=self.config.prices is not None)


def _bytes(data: bytes, media: str, name: str) -> Response:
    """Stored bytes: an image of a safe type inline, anything else (SVG too) a download;
    always under a sandboxing CSP and ``nosniff``."""
    media = media.lower().strip() or "application/octet-stream"
    inline = media in _conversation.INLINE_IMAGES
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:100] or "download"
    disposition = "inline" if inline else f'attachment; filename="{safe}"'
    return Response(data, media_type=media, headers={
        "Content-Disposition": disposition, "Content-Security-Policy": BLOB_CSP})


def _day(text: str | None) -> str | None:
    return date.fromisoformat(text).isoformat() if text else None


def _query(params: Any, **changes: Any) -> dict[str, str]:
    out = {k: v for k, v in params.items() if v}
    for k, v in changes.items():
        out.pop(k, None)
        if v is not None:
            out[k] = str(v)
    return out


def _basic_as_bearer(request: Request) -> Request:
    """HTTP Basic credentials (what a browser prompts for) as the API's: the password is
    the token (``Authorization: Bearer``), the user name ``X-Chatstate-Token``."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return request
    try:
        user, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(
            ":")
    except (binascii.Error, UnicodeDecodeError):
        return request
    headers = [(k, v) for k, v in request.scope["headers"]
               if k.lower() not in (b"authorization", b"x-chatstate-token")]
    headers.append((b"authorization", f"Bearer {password}".encode()))
    if user:
        headers.append((b"x-chatstate-token", user.encode()))
    return Request({**request.scope, "headers": headers})


def create_app(config: WebConfig) -> Starlette:
    """The read-only web view as an ASGI app (mountable: links follow ``root_path``)."""
    view = WebView(config)

    def authorized(handler: Callable[[Request], Awaitable[Response]]
                   ) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            if config.namespace is None:
                request.state.namespace = None
            else:
                ns = config.namespace(_basic_as_bearer(request))
                if ns is None:
                    return Response("a chatstate token is needed: the password of the "
                                    "browser's prompt (or Authorization: Bearer TOKEN)\n",
                                    401, {"WWW-Authenticate": 'Basic realm="chatstate", '
                                          'charset="UTF-8"'}, media_type="text/plain")
                request.state.namespace = ns
            return await handler(request)

        return guarded

    pages = {"/": view.list_page, "/c/{cid}": view.conversation_page,
             "/c/{cid}/export/{fmt}": view.export, "/c/{cid}/blob/{sha}": view.blob,
             "/c/{cid}/part/{label}/{index:int}": view.part, "/usage": view.usage_page}
    routes = [Route(path, authorized(handler), methods=["GET", "HEAD"])
              for path, handler in pages.items()]
    routes += [Route("/static/web.css", view.css_file, methods=["GET", "HEAD"]),
               Route("/static/favicon.svg", view.icon_file, methods=["GET", "HEAD"])]
    app = Starlette(routes=routes,
                    middleware=[Middleware(Guard, host_allowed=config.host_allowed)])
    app.state.web = view
    return app


def _encrypted(store: object) -> bool:
    """The store seals every record (an encryption key is configured): each row says so."""
    from chatstate.stores.sealed import SealedStore

    return isinstance(store, SealedStore)
