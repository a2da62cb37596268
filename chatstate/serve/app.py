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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationInUse,
    InvalidConversationId,
)
from chatstate.serve._auth import BrowserGuard
from chatstate.serve._config import ServeConfig as ServeConfig  # the CLI's import
from chatstate.serve._dialect_routes import dialect_routes
from chatstate.serve._errors import EXCEPTION_HANDLERS, error_for
from chatstate.serve._history import Ambiguous
from chatstate.serve._identity import (
    IDEMPOTENCY_HEADER,
    ConversationPath,
    conversation_id,
    forward_body,
    request_key,
)
from chatstate.serve._limits import namespace_of
from chatstate.serve._messages import MESSAGES_WIRE
from chatstate.serve._metrics import CountRequests, clock
from chatstate.serve._nolog import no_log_refusal
from chatstate.serve._offload import (
    Refusal,
    encode_json,
    parse_request,
)
from chatstate.serve._passthrough import PassThrough
from chatstate.serve._probes import Probes
from chatstate.serve._request_record import request_record
from chatstate.serve._turns import ForeignConversation, Replay, Turn
from chatstate.serve._ui import ui_routes
from chatstate.serve._upstream import Prepared, UpstreamTurns, _TurnEnd
from chatstate.serve._wire import (
    CONVERSATION_HEADER,
    check_request,
    one_choice,
    read_body,
)
from chatstate.serve._wires import CHAT, Wire


class Proxy(UpstreamTurns, Probes):
    """The proxy: a turn's request checked, placed and begun (``_chat``), then sent
    upstream (``UpstreamTurns``); the other endpoints are ``Probes``'."""

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
        the digest that knows it again, what it asked for as stored (its record: scrubbed
        for secrets, CPU the event loop need not spend), and the stored conversation it
        continues, if any
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
        return Prepared(data, messages, cid, forward, rkey, target, encode_json(forward),
                        request_record(forward, None))

    def _prepare_new(self, request: Request, body: bytes, wire: Wire, space: str,
                     keyed: bool) -> tuple[Prepared | Refusal, Turn | Replay | Exception | None]:
        """``_prepare``, and for a request that continues no stored conversation (which
        has no lock to wait for) its first write too (``_begin``: the turn, or what it
        raised), in the same worker-thread hop: under a burst of new conversations each
        hop costs turns of a crowded event loop. None: it continues one (its lock
        first)."""
        prepared = self._prepare(request, body, wire, space)
        if isinstance(prepared, Refusal) or prepared.target is not None:
            return prepared, None
        try:
            return prepared, self._begin(prepared, space, keyed)
        except Exception as exc:  # raised where the request is answered
            return prepared, exc

    def _begin(self, prepared: Prepared, space: str, keyed: bool) -> Turn | Replay:
        """The request's new messages made durable (``Writer.begin``; blocking)."""
        return self.writer.begin(prepared.cid, prepared.messages, namespace=space,
                                 key=prepared.key, keyed=keyed, record=prepared.record)

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
        keyed = IDEMPOTENCY_HEADER in request.headers
        prepared, begun = await asyncio.to_thread(self._prepare_new, request, body, wire,
                                                  space, keyed)
        if isinstance(prepared, Refusal):
            return openai_error(prepared.status, prepared.message, param=prepared.param)
        data = prepared.data
        # Only turns of one stored conversation wait for each other (the lock key: the
        # namespace and the conversation); a new conversation waits for nobody, and was
        # begun already (``_prepare_new``). A client that left while waiting is not sent
        # upstream.
        target = prepared.target
        key = None if target is None else space + "\n" + target
        if key is not None and not await self._hold(key, request):
            return openai_error(499, "the client went away before the request was sent "
                                "upstream", "client_closed")
        try:
            if isinstance(begun, Exception):
                raise begun
            turn = begun if begun is not None else await asyncio.to_thread(
                self._begin, prepared, space, keyed)
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


def create_app(config: ServeConfig) -> Starlette:
    """The proxy as an ASGI app (its lifespan opens the upstream client and the index)."""
    proxy = Proxy(config)
    unstored = PassThrough(proxy.upstream, proxy._http, proxy.upstream_headers,
                           max_body=config.max_body, api_key=config.api_key)
    unstored_messages = PassThrough(  # Anthropic's: its key headers
        proxy.upstream, proxy._http, lambda r: proxy.upstream_headers(r, MESSAGES_WIRE),
        max_body=config.max_body, api_key=config.api_key)
    guarded = {"/v1/chat/completions": proxy.chat_completions, "/v1/models": proxy.models,
               "/v1/embeddings": unstored.embeddings, "/v1/completions": unstored.completions,
               "/v1/models/{model_id:path}": unstored.model,
               "/v1/messages/count_tokens": unstored_messages.count_tokens,
               "/v1/chatstate/conversations": proxy.conversations,
               "/v1/chatstate/conversations/{cid}": proxy.conversation,
               "/metrics": proxy.metrics_text, **dialect_routes(proxy)}
    methods = {"/v1/chat/completions": ["POST"], "/v1/embeddings": ["POST"],
               "/v1/completions": ["POST"], "/v1/responses": ["POST"], "/v1/messages": ["POST"],
               "/v1/messages/count_tokens": ["POST"],
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
            return error_for(request.url.path, 401, "missing or wrong chatstate token",
                             "authentication_error")
        request.state.namespace = namespace
        return await handler(request)

    return guarded
