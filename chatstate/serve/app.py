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
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from chatstate.core.redact import scrub
from chatstate.durable.guard import boot_id
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationInUse,
    InvalidConversationId,
)
from chatstate.serve._auth import Auth, BrowserGuard
from chatstate.serve._conversations import Conversations
from chatstate.serve._dialect_routes import dialect_routes
from chatstate.serve._errors import EXCEPTION_HANDLERS
from chatstate.serve._headers import forwarded, relayed_headers
from chatstate.serve._history import Ambiguous
from chatstate.serve._identity import (
    IDEMPOTENCY_HEADER,
    ConversationPath,
    conversation_id,
    forward_body,
    request_key,
)
from chatstate.serve._index import StoreIndex
from chatstate.serve._limits import ConversationLocks, NamespaceLimits, namespace_of
from chatstate.serve._metrics import CountRequests, Metrics, clock, first_chunk_timed
from chatstate.serve._nolog import no_log_refusal
from chatstate.serve._offload import (
    JSON,
    MAX_DEPTH,
    MAX_MESSAGES,
    Refusal,
    encode_json,
    parse_request,
)
from chatstate.serve._passthrough import PassThrough
from chatstate.serve._readiness import Readiness
from chatstate.serve._relay import RelayResponse, StreamRelay, chat_holds, client_failure
from chatstate.serve._request_record import RESPONSE, outcome, request_record
from chatstate.serve._stream_check import event_stream
from chatstate.serve._turns import ForeignConversation, Replay, Turn, Writer
from chatstate.serve._ui import ui_routes
from chatstate.serve._wire import (
    CONVERSATION_HEADER,
    bearer,
    check_request,
    one_choice,
    openai_error,
    passthrough,
    read_body,
    upstream_error,
)
from chatstate.serve._wires import CHAT, Wire
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
    max_messages: int = MAX_MESSAGES  # more in one request: 413
    max_depth: int = MAX_DEPTH  # JSON nested deeper: 400
    max_concurrent: int | None = None  # turns in flight per namespace, then 429
    rate: float | None = None  # requests per second per namespace, then 429
    ready_cache: float = 1.0  # seconds /readyz reuses its last store probe
    allowed_hosts: list[str] = field(default_factory=list)  # beyond loopback and IP literals
    worker_threads: int = 64
    """Threads for blocking work (store calls, parsing): a burst's writers share commits."""


@dataclass(frozen=True)
class Prepared:
    """A request checked and placed, before anything of it is written (``_prepare``)."""

    data: Any  # the request as parsed
    messages: list[dict[str, Any]]  # its messages in the stored form
    cid: str | None  # the conversation it names
    forward: dict[str, Any]  # the body to forward
    key: str  # what knows the same request again (``request_key``)
    target: str | None  # the stored conversation it continues (None: a new one)
    content: bytes  # ``forward`` encoded


class _TurnEnd:
    """Ends a turn once: its writer lease goes, then the next request on it may begin."""

    def __init__(self, writer: Writer, turn: Turn, release: Callable[[], None]) -> None:
        self.writer, self.turn, self.release = writer, turn, release
        self.done = False

    async def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            await asyncio.to_thread(self.writer.end, self.turn)
        finally:
            self.release()


class Proxy:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.upstream = config.upstream.rstrip("/")
        self.metrics = Metrics()
        self.index = StoreIndex(config.store)
        self.writer = Writer(self.metrics.store(config.store), self.index,
                             lease_wait=config.lease_wait)
        self.auth = Auth(config.tokens, config.pass_client_key)
        self.listing = Conversations(config.store, self.index)
        self.locks = ConversationLocks()
        self.limits = NamespaceLimits(config.max_concurrent, config.rate)
        self.readiness = Readiness(config.store, config.ready_cache, self.metrics.probes.inc)
        self.client: httpx2.AsyncClient | None = None
        self.indexing: asyncio.Future[int] | None = None

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
        # Store calls wait on the disk and on the store's lock, not on the CPU: with the
        # default pool (CPUs + 4 threads) a burst of new conversations queued behind a
        # handful of them, and sqlite's group commit could only group that many writers.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(
            max_workers=self.config.worker_threads, thread_name_prefix="chatstate-serve"))
        # The store's summaries, in the background: serving starts at once, and only a
        # request that may continue a stored conversation without naming it waits.
        self.indexing = asyncio.ensure_future(asyncio.to_thread(self.index.start))
        self.indexing.add_done_callback(_indexed)

    async def shutdown(self) -> None:
        if self.indexing is not None:
            self.indexing.cancel()
        if self.client is not None:
            await self.client.aclose()

    def _http(self) -> httpx2.AsyncClient:
        assert self.client is not None, "the app's lifespan has not started"
        return self.client

    # -- auth ------------------------------------------------------------------------------
    def namespace(self, request: Request) -> str | None:
        """The caller's namespace ("": the default one); None: not authorized."""
        return self.auth.namespace(request)

    def upstream_headers(self, request: Request, wire: Wire = CHAT) -> dict[str, str]:
        headers = {"User-Agent": "chatstate-serve", **forwarded(request.headers)}
        headers.update({k: request.headers[k] for k in wire.passed_headers
                        if k in request.headers})
        if self.config.pass_client_key:
            for name in ("authorization", "x-api-key"):
                if name in request.headers:
                    headers[name] = request.headers[name]
        elif self.config.api_key:
            headers.update(wire.key_headers(self.config.api_key) if wire.key_headers
                           else {"Authorization": f"Bearer {self.config.api_key}"})
        return headers

    # -- endpoints ---------------------------------------------------------------------------
    async def chat_completions(self, request: Request, wire: Wire = CHAT) -> Response:
        """A turn of any wire API (``_wires``): chat completions, Responses, Messages."""
        request.state.started = clock()
        namespace = namespace_of(request)
        refused = self.limits.enter(namespace)
        if refused is not None:
            message, wait, limit = refused
            self.metrics.rejected.labels(namespace, limit).inc()
            limited = wire.error(429, message, "rate_limit_error")
            limited.headers["Retry-After"] = str(wait)
            return limited
        slot = [True]  # this request's slot, until a turn takes it over
        try:
            return await self._chat(request, namespace, slot, wire)
        finally:
            if slot[0]:
                self.limits.leave(namespace)

    def _parse(self, body: bytes, wire: Wire = CHAT, namespace: str = "") -> Any:
        """(the checked request, its messages in the stored form), or a Refusal (blocking:
        CPU in proportion to the body)."""
        data = parse_request(body, max_messages=self.config.max_messages,
                             max_depth=self.config.max_depth)
        if isinstance(data, Refusal):
            return data
        if wire.expand is not None and isinstance(data, dict):
            try:
                data = wire.expand(self.config.store, namespace, data)
            except LookupError as exc:
                return Refusal(404, f"Previous response with id '{exc}' not found.")
        messages: Any = data.get("messages") if isinstance(data, dict) else None
        if wire is not CHAT and isinstance(data, dict):
            try:
                messages = wire.messages(data)
            except ValueError as exc:
                return Refusal(400, str(exc))
            if len(messages) > self.config.max_messages:
                return Refusal(413, f"the request has {len(messages)} messages, over the "
                               f"limit of {self.config.max_messages} (--max-messages)")
        problem = check_request(data if wire is CHAT else {"messages": messages})
        if problem:
            return Refusal(400, problem)
        problem = one_choice(data) if wire is CHAT else None
        if problem:
            return Refusal(400, problem, "n")
        return data, messages

    async def _indexed(self) -> None:
        """Wait for the store's summaries while they are still being read (at startup)."""
        if self.indexing is not None and not self.indexing.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self.indexing)

    def _prepare(self, request: Request, body: bytes, wire: Wire, space: str
                 ) -> Prepared | Refusal:
        """Everything about a request that comes before its first write, in one
        worker-thread hop (blocking: CPU in proportion to the body): the checked request
        (``_parse``), the conversation it names, the body to forward (and its bytes),
        the digest that knows it again, and the stored conversation it continues, if any
        (None: a new one, or a history more than one conversation has: it starts a new
        one). Under a burst every hop waits its turn behind every other request's, so
        one hop instead of four brings the first chunk forward."""
        parsed = self._parse(body, wire, space)
        if isinstance(parsed, Refusal):
            return parsed
        data, messages = parsed
        try:
            cid = conversation_id(request, data)
        except InvalidConversationId as exc:
            return Refusal(400, str(exc))
        forward = forward_body(data)
        # a digest of the whole body: CPU in proportion to it, off the event loop
        rkey = request_key(request, space, forward, cid)
        self.index.prime(cid, messages)
        target = cid
        if cid is None and len(messages) >= 2:  # a first turn continues nothing
            try:
                target = self.index.find(space, messages)
            except Ambiguous:
                target = None
        return Prepared(data, messages, cid, forward, rkey, target, encode_json(forward))

    async def _chat(self, request: Request, namespace: str, slot: list[bool],
                    wire: Wire = CHAT) -> Response:
        openai_error = wire.error  # every error of this turn in the API's shape
        refused = no_log_refusal(request)
        if refused is not None:
            return refused
        body = await read_body(request, self.config.max_body)
        if isinstance(body, Response):
            return body
        space: str = request.state.namespace  # the store's; ``namespace``: the label
        await self._indexed()
        prepared = await asyncio.to_thread(self._prepare, request, body, wire, space)
        if isinstance(prepared, Refusal):
            return openai_error(prepared.status, prepared.message, param=prepared.param)
        data, messages, cid, forward, rkey = (prepared.data, prepared.messages, prepared.cid,
                                              prepared.forward, prepared.key)
        # Only turns of one stored conversation wait for each other (the lock key: the
        # namespace and the conversation); a new conversation waits for nobody. A client
        # that left while waiting is not sent upstream.
        target = prepared.target
        key = None if target is None else space + "\n" + target
        if not await self._hold(key, request):
            return openai_error(499, "the client went away before the request was sent "
                                "upstream", "client_closed")
        try:
            turn = await asyncio.to_thread(functools.partial(
                self.writer.begin, cid, messages, namespace=space, key=rkey,
                keyed=IDEMPOTENCY_HEADER in request.headers,
                record=request_record(forward, None)))
            if isinstance(turn, Replay):
                if key is not None:
                    self.locks.release(key)
                return wire.replay(turn.reply, bool(data.get("stream")),
                                   {CONVERSATION_HEADER: turn.conversation.id})
            turn_key = space + "\n" + turn.id
            if turn_key != key:  # a new conversation or a fork: hold it instead
                await self._hold(turn_key, request, wait_gone=False)
                if key is not None:
                    self.locks.release(key)
                key = turn_key
        except BaseException as exc:
            if key is not None:
                self.locks.release(key)
            if isinstance(exc, ConflictError):
                self.metrics.lease_conflicts.labels(namespace).inc()
            if isinstance(exc, ForeignConversation):
                return openai_error(404, f"conversation {exc} is not this client's: name "
                                    "another id", "not_found")
            if isinstance(exc, ConversationInUse):
                return openai_error(409, str(exc), "conversation_in_use")
            if isinstance(exc, ConflictError):
                return openai_error(409, f"conversation changed by another writer: {exc}",
                                    "conflict")
            if isinstance(exc, ChatstateError):
                return openai_error(500, f"the conversation could not be stored, so the "
                                    f"request was not sent: {exc}", "storage_error")
            if isinstance(exc, ValueError):  # pydantic: a message chatstate cannot hold
                return openai_error(400, f"a message could not be stored: {exc}")
            raise
        headers = {CONVERSATION_HEADER: turn.id}
        held = key

        def release() -> None:
            self.locks.release(held)
            self.limits.leave(namespace)

        end = _TurnEnd(self.writer, turn, release)
        slot[0] = False
        if not data.get("stream"):
            try:
                return await self._plain(request, turn, prepared, headers, namespace, wire)
            finally:
                await end()
        try:
            return await self._stream(request, turn, prepared, headers, end, namespace, wire)
        except BaseException:  # once the relay has begun, its cleanup ends the turn
            await end()
            raise

    async def _hold(self, key: str | None, request: Request, wait_gone: bool = True) -> bool:
        """Hold ``key``'s lock (None: none to hold); False if the client left meanwhile."""
        if key is None:
            return not await request.is_disconnected()

        async def never() -> bool:
            return False

        return await self.locks.acquire(key, request.is_disconnected if wait_gone else never)

    def _committed(self, turn: Turn, reply: Mapping[str, Any], namespace: str,
                   found: dict[str, Any]) -> Any:
        message = self.writer.commit(turn, {**reply, "params": {RESPONSE: found}})
        self.metrics.reply(reply, namespace)
        return message

    async def _plain(self, request: Request, turn: Turn, prepared: Prepared,
                     headers: dict[str, str], namespace: str, wire: Wire = CHAT) -> Response:
        """``prepared``: the request as ``_prepare`` read it (the body to forward, encoded)."""
        content, forward = prepared.content, prepared.forward
        openai_error = wire.error
        try:
            started = clock()
            resp = await self._http().post(self.upstream + wire.upstream_path,
                                           content=content, headers={
                                               **self.upstream_headers(request, wire), **JSON})
            self.metrics.upstream.labels("/v1" + wire.upstream_path).observe(clock() - started)
        except httpx2.HTTPError as exc:
            await asyncio.to_thread(self.writer.note_failure, turn, 502, str(exc))
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}",
                                "upstream_error", headers=headers)
        if resp.status_code >= 400:
            stored, relayed = upstream_error(resp.content, resp.status_code, headers,
                                             resp.headers, self.config.api_key,
                                             bearer(request.headers.get("authorization", "")))
            await asyncio.to_thread(self.writer.note_failure, turn, resp.status_code, stored,
                                    outcome(resp.status_code, clock() - started, resp.headers))
            return relayed
        try:
            reply = wire.settle(wire.reply_fields(resp.json()), forward)
        except ValueError as exc:
            await asyncio.to_thread(self.writer.note_failure, turn, 502, str(exc),
                                    outcome(resp.status_code, clock() - started, resp.headers))
            return openai_error(502, f"the upstream reply is not a {wire.name} reply: {exc}",
                                "upstream_error", headers=headers)
        await asyncio.to_thread(self._committed, turn, reply, namespace,
                                outcome(resp.status_code, clock() - started, resp.headers))
        return passthrough(resp, headers)

    async def _stream(self, request: Request, turn: Turn, prepared: Prepared,
                      headers: dict[str, str], end: _TurnEnd, namespace: str,
                      wire: Wire = CHAT) -> Response:
        """``prepared``: the request as ``_prepare`` read it (the body to forward, encoded)."""
        content, forward = prepared.content, prepared.forward
        openai_error = wire.error
        http = self._http()
        try:
            upstream_request = http.build_request(
                "POST", self.upstream + wire.upstream_path, content=content,
                headers={**self.upstream_headers(request, wire), **JSON,
                         "Accept": "text/event-stream"})
            started = clock()
            resp = await http.send(upstream_request, stream=True)
            self.metrics.upstream.labels("/v1" + wire.upstream_path).observe(clock() - started)
        except httpx2.HTTPError as exc:
            await asyncio.to_thread(self.writer.note_failure, turn, 502, str(exc))
            await end()
            return openai_error(502, f"upstream unreachable: {type(exc).__name__}",
                                "upstream_error", headers=headers)
        if resp.status_code >= 400:
            try:
                content = await resp.aread()
            finally:
                await resp.aclose()
            stored, relayed = upstream_error(content, resp.status_code, headers,
                                             resp.headers, self.config.api_key,
                                             bearer(request.headers.get("authorization", "")))
            await asyncio.to_thread(self.writer.note_failure, turn, resp.status_code, stored,
                                    outcome(resp.status_code, clock() - started, resp.headers))
            await end()
            return relayed
        lines, problem = await event_stream(resp, self.config.api_key,
                                            bearer(request.headers.get("authorization", "")))
        if problem is not None:  # an HTML page, JSON, nothing: not a stream to relay
            await asyncio.to_thread(self.writer.note_failure, turn, 502, problem)
            await end()
            return openai_error(502, problem, "upstream_error", headers=headers)
        writer = self.writer
        relay = StreamRelay(
            lines,
            save_partial=lambda text, model: writer.save_partial(turn, text, model),
            commit=lambda reply: self._committed(
                turn, wire.settle(reply, forward), namespace,
                outcome(resp.status_code, clock() - started, resp.headers)),
            fail=lambda status, detail: writer.note_failure(
                turn, status, detail, outcome(status, clock() - started, resp.headers)),
            redact=lambda text: scrub(text, self.config.api_key, bearer(
                request.headers.get("authorization", "")), limit=None),
            decoder=wire.decoder() if wire.decoder else None, named=wire.named,
            holds=wire.holds or chat_holds, rewrite=wire.rewrite() if wire.rewrite else None,
            failures=wire.failures())

        async def cleanup() -> None:
            try:
                await resp.aclose()
                if turn.writer.lost is not None:  # another writer has it: write nothing
                    log.warning("serve: %s", turn.writer.lost)
                elif not relay.committed:  # the client went away, or the upstream did
                    await asyncio.to_thread(relay.save_now)
                    log.info("serve: %s: turn %s left as partial (%d chars)", turn.id,
                             turn.turn_id, relay.saved_chars)
                    if relay.failed is None:  # the upstream's failure is recorded already
                        await asyncio.to_thread(self.writer.note_failure, turn,
                                                *client_failure(relay))
            finally:
                await end()

        events = first_chunk_timed(relay.events(), request.state.started,
                                   self.metrics.first_chunk)
        return RelayResponse(events, cleanup,
                             headers={**relayed_headers(resp.headers), **headers},
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
        report = await self.readiness.check()
        if self.config.tokens and self.namespace(request) is None:
            # no token, no details (the store's path, its probe, the pid): the status only
            ok = report.ok and (not self.config.ready_upstream
                                or (await self._upstream_ready(request))["ok"])
            return JSONResponse({"ready": ok}, status_code=200 if ok else 503)
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

    async def metrics_text(self, request: Request) -> Response:
        content, media_type = self.metrics.render()
        return Response(content, headers={"Content-Type": media_type})


def _indexed(task: asyncio.Future[int]) -> None:
    if task.cancelled():
        return
    if task.exception() is not None:
        log.error("serve: indexing the stored conversations failed: %s", task.exception())
    else:
        log.info("serve: %d stored conversations, indexed as requests need them",
                 task.result())


def create_app(config: ServeConfig) -> Starlette:
    """The proxy as an ASGI app (its lifespan opens the upstream client and the index)."""
    proxy = Proxy(config)
    unstored = PassThrough(proxy.upstream, proxy._http, proxy.upstream_headers,
                           max_body=config.max_body, api_key=config.api_key)
    guarded = {"/v1/chat/completions": proxy.chat_completions, "/v1/models": proxy.models,
               "/v1/embeddings": unstored.embeddings, "/v1/completions": unstored.completions,
               "/v1/models/{model_id:path}": unstored.model,
               "/v1/chatstate/conversations": proxy.conversations,
               "/v1/chatstate/conversations/{cid}": proxy.conversation,
               "/metrics": proxy.metrics_text, **dialect_routes(proxy)}
    methods = {"/v1/chat/completions": ["POST"], "/v1/embeddings": ["POST"],
               "/v1/completions": ["POST"], "/v1/responses": ["POST"], "/v1/messages": ["POST"],
               "/v1/chatstate/conversations/{cid}": ["GET", "DELETE"]}
    routes: list[BaseRoute] = [Route(path, _authorize(proxy, handler),
                                     methods=methods.get(path, ["GET"]))
              for path, handler in guarded.items()]
    routes += [Route("/healthz", proxy.healthz), Route("/readyz", proxy.readyz)]
    routes += ui_routes(config.store, proxy.auth, config.allowed_hosts)  # the web view

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await proxy.startup()
        try:
            yield
        finally:
            await proxy.shutdown()

    counted = Middleware(CountRequests, metrics=proxy.metrics,
                         namespace=lambda scope: namespace_of(Request(scope)))
    middleware = [counted, Middleware(BrowserGuard, allowed_hosts=config.allowed_hosts),
                  Middleware(ConversationPath)]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers=EXCEPTION_HANDLERS)
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
