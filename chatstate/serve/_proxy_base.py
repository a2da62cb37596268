"""The proxy's state and what every part of it shares: the upstream client, the caller's
namespace, the headers a request takes upstream (``ProxyBase``)."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import httpx2
from starlette.requests import Request

from chatstate.serve._auth import Auth
from chatstate.serve._config import ServeConfig
from chatstate.serve._conversations import Conversations
from chatstate.serve._headers import forwarded
from chatstate.serve._index import StoreIndex
from chatstate.serve._limits import ConversationLocks, NamespaceLimits
from chatstate.serve._metrics import Metrics
from chatstate.serve._readiness import Readiness
from chatstate.serve._turns import Writer
from chatstate.serve._wires import CHAT, Wire

log = logging.getLogger("chatstate.serve")


class ProxyBase:
    """The proxy's parts (``app.Proxy``) over one config: its store, writer, index, limits."""

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
        self.metrics.collector.start()
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
        self.metrics.collector.stop()
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


def _indexed(task: asyncio.Future[int]) -> None:
    if task.cancelled():
        return
    if task.exception() is not None:
        log.error("serve: indexing the stored conversations failed: %s", task.exception())
    else:
        log.info("serve: %d stored conversations, indexed as requests need them",
                 task.result())
