"""The ASGI app of ``chatstate serve``: an OpenAI-compatible proxy that persists first.

``POST /v1/chat/completions`` (plain and streamed) is forwarded to the upstream
with every field as the client sent it; the request's new messages are durable
before it leaves, and the reply is durable before the client sees it.
``GET /v1/models`` passes through. ``/healthz`` says the process is up,
``/readyz`` writes, reads back and deletes a probe in the store, and
``/v1/chatstate/conversations[/{id}]`` lists (pages, searches), replays and deletes
what is stored, all within the caller's namespace (``_auth``). ``/c/<id>/v1/...`` is
``/v1/...`` naming conversation ``<id>`` (``_identity``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chatstate.durable.guard import boot_id
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationInUse,
    InvalidConversationId,
)
from chatstate.serve._auth import Auth, BrowserGuard
from chatstate.serve._conversations import Conversations
from chatstate.serve._history import HistoryIndex, history_digest, wire_form
from chatstate.serve._identity import (
    IDEMPOTENCY_HEADER,
    ConversationPath,
    conversation_id,
    forward_body,
    request_key,
)
from chatstate.serve._relay import RelayResponse, StreamRelay
from chatstate.serve._replay import replay_response
from chatstate.serve._turns import ForeignConversation, Replay, Turn, Writer
from chatstate.serve._wire import (
    CONVERSATION_HEADER,
    bearer,
    check_request,
    openai_error,
    passthrough,
    read_body,
    reply_fields,
    upstream_error,
)
from chatstate.stores.base import Store

log = logging.getLogger("chatstate.serve")



@dataclass
class ServeConfig:
    store: Store
    upstream: str
    api_key: str | None = None
    tokens: list[str] = field(default_factory=list)
    pass_client_key: bool = False
    max_body: int = 32 * 1024 * 1024
    ready_upstream: bool = False
    timeout: float | None = 60.0
    connect_timeout: float = 10.0
    lease_wait: float = 0.0  # seconds a turn waits for another live writer, then 409
    allowed_hosts: list[str] = field(default_factory=list)  # beyond loopback and IP literals


class _TurnEnd:
    """Ends a turn once: its writer lease goes, then the next request on it may begin."""

    def __init__(self, writer: Writer, turn: Turn, lock: asyncio.Lock) -> None:
        self.writer, self.turn, self.lock = writer, turn, lock
        self.done = False

    async def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            await asyncio.to_thread(self.writer.end, self.turn)
        finally:
            self.lock.release()


class Proxy:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.upstream = config.upstream.rstrip("/")
        self.writer = Writer(config.store, HistoryIndex(), lease_wait=config.lease_wait)
        self.auth = Auth(config.tokens, config.pass_client_key)
        self.listing = Conversations(config.store, self.writer.index)
        self._locks: dict[str, asyncio.Lock] = {}
        self.client: httpx2.AsyncClient | None = None

    # -- lifecycle ---------------------------------------------------------------------
    async def startup(self) -> None:
        timeout = self.config.timeout
        connect = self.config.connect_timeout if timeout is None else min(
            self.config.connect_timeout, timeout)
        # the openai SDK's limits: httpx2's default pool (100) would hold stream 101 back
        # until another one ended
        limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=100)
        self.client = httpx2.AsyncClient(timeout=httpx2.Timeout(timeout, connect=connect),
                                         limits=limits)
        count = await asyncio.to_thread(self.writer.build_index)
        log.info("serve: indexed %d stored conversations", count)

    async def shutdown(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    def _http(self) -> httpx2.AsyncClient:
        assert self.client is not None, "the app's lifespan has not started"
        return self.client

    # -- auth ------------------------------------------------------------------------------
    def namespace(self, request: Request) -> str | None:
        """The caller's namespace ("": the default one); None: not authorized."""
        return self.auth.namespace(request)

    def upstream_headers(self, request: Request) -> dict[str, str]:
        headers = {"User-Agent": "chatstate-serve"}
        if self.config.pass_client_key:
            if "authorization" in request.headers:
                headers["Authorization"] = request.headers["authorization"]
        elif self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    # -- endpoints ---------------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        body = await read_body(request, self.config.max_body)
        if isinstance(body, Response):
            return body
        try:
            data = json.loads(body)
        except ValueError as exc:
            return openai_error(400, f"the request body is not JSON ({exc})")
        problem = check_request(data)
        if problem:
            return openai_error(400, problem)
        try:
            cid = conversation_id(request, data)
        except InvalidConversationId as exc:
            return openai_error(400, str(exc))
        messages: list[dict[str, Any]] = data["messages"]
        namespace: str = request.state.namespace
        forward = forward_body(data)
        key = request_key(request, namespace, forward, cid)
        lock = self._lock(namespace + "\n" + (
            cid or history_digest([wire_form(m) for m in messages[:-1]])))
        await lock.acquire()
        try:
            turn = await asyncio.to_thread(functools.partial(
                self.writer.begin, cid, messages, namespace=namespace, key=key,
                keyed=IDEMPOTENCY_HEADER in request.headers))
        except ForeignConversation as exc:
            lock.release()
            return openai_error(404, f"conversation {exc} is not this client's: name "
                                "another id", "not_found")
        except ConversationInUse as exc:
            lock.release()
            return openai_error(409, str(exc), "conversation_in_use")
        except ConflictError as exc:
            lock.release()
            return openai_error(409, f"conversation changed by another writer: {exc}",
                                "conflict")
        except ChatstateError as exc:
            lock.release()
            return openai_error(500, f"the conversation could not be stored, so the request "
                                f"was not sent: {exc}", "storage_error")
        except ValueError as exc:  # pydantic: a message chatstate cannot hold
            lock.release()
            return openai_error(400, f"a message could not be stored: {exc}")
        except BaseException:
            lock.release()
            raise
        if isinstance(turn, Replay):
            lock.release()
            return replay_response(turn.reply, bool(data.get("stream")),
                                   {CONVERSATION_HEADER: turn.conversation.id})
        headers = {CONVERSATION_HEADER: turn.id}
        end = _TurnEnd(self.writer, turn, lock)
        if not data.get("stream"):
            try:
                return await self._plain(request, turn, forward, headers)
            finally:
                await end()
        try:
            return await self._stream(request, turn, forward, headers, end)
        except BaseException:  # once the relay has begun, its cleanup ends the turn
            await end()
            raise

    async def _plain(self, request: Request, turn: Turn, forward: dict[str, Any],
                     headers: dict[str, str]) -> Response:
        try:
            resp = await self._http().post(self.upstream + "/chat/completions", json=forward,
                                           headers=self.upstream_headers(request))
        except httpx2.HTTPError as exc:
            await asyncio.to_thread(self.writer.note_failure, turn, 502, str(exc))
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}",
                                "upstream_error")
        if resp.status_code >= 400:
            stored, relayed = upstream_error(resp.content, resp.status_code, headers,
                                             resp.headers, self.config.api_key,
                                             bearer(request.headers.get("authorization", "")))
            await asyncio.to_thread(self.writer.note_failure, turn, resp.status_code, stored)
            return relayed
        try:
            reply = reply_fields(resp.json())
        except ValueError as exc:
            await asyncio.to_thread(self.writer.note_failure, turn, 502, str(exc))
            return openai_error(502, f"the upstream reply is not a chat completion: {exc}",
                                "upstream_error")
        await asyncio.to_thread(self.writer.commit, turn, reply)
        return passthrough(resp, headers)

    async def _stream(self, request: Request, turn: Turn, forward: dict[str, Any],
                      headers: dict[str, str], end: _TurnEnd) -> Response:
        http = self._http()
        try:
            upstream_request = http.build_request(
                "POST", self.upstream + "/chat/completions", json=forward,
                headers={**self.upstream_headers(request), "Accept": "text/event-stream"})
            resp = await http.send(upstream_request, stream=True)
        except httpx2.HTTPError as exc:
            await asyncio.to_thread(self.writer.note_failure, turn, 502, str(exc))
            await end()
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}",
                                "upstream_error")
        if resp.status_code >= 400:
            try:
                content = await resp.aread()
            finally:
                await resp.aclose()
            stored, relayed = upstream_error(content, resp.status_code, headers,
                                             resp.headers, self.config.api_key,
                                             bearer(request.headers.get("authorization", "")))
            await asyncio.to_thread(self.writer.note_failure, turn, resp.status_code, stored)
            await end()
            return relayed
        writer = self.writer
        relay = StreamRelay(
            resp.aiter_lines(),
            save_partial=lambda text, model: writer.save_partial(turn, text, model),
            commit=lambda reply: writer.commit(turn, reply),
            fail=lambda detail: writer.note_failure(turn, 502, detail))

        async def cleanup() -> None:
            try:
                await resp.aclose()
                if turn.writer.lost is not None:  # another writer has it: write nothing
                    log.warning("serve: %s", turn.writer.lost)
                elif not relay.committed:  # the client went away, or the upstream did
                    await asyncio.to_thread(relay.save_now)
                    log.info("serve: %s: turn %s left as partial (%d chars)", turn.id,
                             turn.turn_id, len(relay.saved))
            finally:
                await end()

        return RelayResponse(relay.events(), cleanup, headers=headers,
                             media_type="text/event-stream")

    async def models(self, request: Request) -> Response:
        try:
            resp = await self._http().get(self.upstream + "/models",
                                          headers=self.upstream_headers(request))
        except httpx2.HTTPError as exc:
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}",
                                "upstream_error")
        return passthrough(resp, {})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "boot_id": boot_id(),
                             "durability": self._verdict()})

    async def readyz(self, request: Request) -> Response:
        report = await asyncio.to_thread(self.config.store.check)
        body: dict[str, Any] = {"ready": report.ok, "boot_id": boot_id(),
                                "store": {"durability": self._verdict(),
                                          "check": report.to_dict()}}
        if not report.ok:
            body["reason"] = f"store check failed: {report.error}"
        if self.config.ready_upstream:
            upstream = await self._upstream_ready(request)
            body["upstream"] = upstream
            if not upstream["ok"]:
                body["ready"] = False
                body.setdefault("reason", f"upstream not ready: {upstream['detail']}")
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    async def _upstream_ready(self, request: Request) -> dict[str, Any]:
        try:
            resp = await self._http().get(self.upstream + "/models", timeout=3.0,
                                          headers=self.upstream_headers(request))
        except httpx2.HTTPError as exc:
            return {"ok": False, "detail": f"unreachable ({type(exc).__name__})"}
        ok = resp.status_code < 400
        return {"ok": ok, "status": resp.status_code,
                "detail": "GET /models answered" if ok else f"HTTP {resp.status_code}"}

    def _verdict(self) -> str | None:
        report = getattr(self.config.store, "guard_report", None)
        return getattr(report, "verdict", None)

    async def conversations(self, request: Request) -> Response:
        return await self.listing.page(request)

    async def conversation(self, request: Request) -> Response:
        return await self.listing.one(request)

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock


def create_app(config: ServeConfig) -> Starlette:
    """The proxy as an ASGI app (its lifespan opens the upstream client and the index)."""
    proxy = Proxy(config)
    guarded = {"/v1/chat/completions": proxy.chat_completions, "/v1/models": proxy.models,
               "/v1/chatstate/conversations": proxy.conversations,
               "/v1/chatstate/conversations/{cid}": proxy.conversation}
    methods = {"/v1/chat/completions": ["POST"],
               "/v1/chatstate/conversations/{cid}": ["GET", "DELETE"]}
    routes = [Route(path, _authorize(proxy, handler), methods=methods.get(path, ["GET"]))
              for path, handler in guarded.items()]
    routes += [Route("/healthz", proxy.healthz), Route("/readyz", proxy.readyz)]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await proxy.startup()
        try:
            yield
        finally:
            await proxy.shutdown()

    middleware = [Middleware(BrowserGuard, allowed_hosts=config.allowed_hosts),
                  Middleware(ConversationPath)]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.proxy = proxy
    return app


def _authorize(proxy: Proxy, handler: Callable[[Request], Awaitable[Response]]
               ) -> Callable[[Request], Awaitable[Response]]:
    async def guarded(request: Request) -> Response:
        namespace = proxy.namespace(request)
        if namespace is None:
            return openai_error(401, "missing or wrong chatstate token", "authentication_error")
        request.state.namespace = namespace
        return await handler(request)

    return guarded
