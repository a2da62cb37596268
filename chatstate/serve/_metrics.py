"""``/metrics``: the proxy's counters in the Prometheus text format.

Requests by route, status and namespace; upstream latency (to the reply's headers);
first-chunk latency of streams (request start to the first bytes sent on); store
write latency by operation; lease conflicts; tokens by model, namespace and kind;
readiness probes run. Each app has a registry of its own (several apps can live in
one process). ``prometheus_client`` is imported when an app is made, never by
``chatstate`` itself.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatstate.serve._gc import CollectorPauses
from chatstate.stores.base import Store
from chatstate.stores.forwarding import ForwardingStore

P = ParamSpec("P")
T = TypeVar("T")

_WRITES = frozenset({"create", "append", "save_partial", "clear_partial", "set_header",
                     "delete", "acquire_lease", "renew_lease", "release_lease",
                     "create_leased"})


class Metrics:
    def __init__(self) -> None:
        try:
            import prometheus_client as prom
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                "chatstate serve's /metrics needs prometheus-client: pip install "
                "'chatstate[serve]'", name=exc.name) from exc
        self._prom = prom
        self.registry = prom.CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = prom.Counter("chatstate_serve_requests", "HTTP requests answered",
                                     ["route", "status", "namespace"], registry=r)
        self.upstream = prom.Histogram("chatstate_serve_upstream_seconds", "Seconds until the "
                                       "upstream's response headers", ["route"], registry=r)
        self.first_chunk = prom.Histogram("chatstate_serve_first_chunk_seconds", "Seconds from "
                                          "a streamed request to its first bytes sent on",
                                          registry=r)
        self.store_write = prom.Histogram("chatstate_serve_store_write_seconds", "Seconds of "
                                          "one store write", ["op"], registry=r,
                                          buckets=(.0005, .001, .0025, .005, .01, .025, .05,
                                                   .1, .25, .5, 1, 2.5, 5, 10))
        self.lease_conflicts = prom.Counter("chatstate_serve_lease_conflicts", "Requests "
                                            "answered 409 because another writer had the "
                                            "conversation", ["namespace"], registry=r)
        self.tokens = prom.Counter("chatstate_serve_tokens", "Tokens the upstream reported",
                                   ["model", "namespace", "kind"], registry=r)
        self.rejected = prom.Counter("chatstate_serve_limited", "Requests answered 429 by "
                                     "--max-concurrent or --rate", ["namespace", "limit"],
                                     registry=r)
        self.probes = prom.Counter("chatstate_serve_readiness_probes", "Store probes run by "
                                   "/readyz", registry=r)
        self.lease_conflicts.labels("default")  # present (at 0) before the first conflict
        self.collector = CollectorPauses()
        r.register(self.collector)

    def render(self) -> tuple[bytes, str]:
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST

    def reply(self, reply: Mapping[str, Any], namespace: str) -> None:
        """Count a committed reply's tokens."""
        usage = reply.get("usage") or {}
        model = str(reply.get("model") or "unknown")
        for kind in ("prompt_tokens", "completion_tokens"):
            count = usage.get(kind)
            if isinstance(count, int) and count > 0:
                self.tokens.labels(model, namespace, kind.removesuffix("_tokens")).inc(count)

    def store(self, inner: Store) -> Store:
        """``inner`` with each write timed."""
        return TimedStore(inner, self.store_write)


class CountRequests:
    """ASGI middleware: count each HTTP request by the route it matched (its template)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, namespace: Callable[[Scope], str]
                 ) -> None:
        self.app, self.metrics, self.namespace = app, metrics, namespace

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, str(status), self.namespace(scope)).inc()


class TimedStore(ForwardingStore):
    """Times every write of the store it wraps (reads pass through untimed)."""

    def __init__(self, inner: Store, histogram: Any) -> None:
        super().__init__(inner)
        self._histogram = histogram

    def _call(self, method: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        name = getattr(method, "__name__", "")
        if name not in _WRITES:
            return method(*args, **kwargs)
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            self._histogram.labels(name).observe(time.perf_counter() - start)


def clock() -> float:
    return time.perf_counter()


async def first_chunk_timed(events: AsyncIterator[bytes], started: float,
                            histogram: Any) -> AsyncIterator[bytes]:
    """``events``, observing the time from ``started`` to the first of them."""
    try:
        first = True
        async for chunk in events:
            if first:
                histogram.observe(clock() - started)
                first = False
            yield chunk
    finally:
        await events.aclose()  # type: ignore[attr-defined]
