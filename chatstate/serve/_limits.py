"""Who may go ahead: one turn at a time per conversation, and per-namespace limits.

``ConversationLocks`` orders the turns of one conversation inside this process (the
writer lease orders them between processes). Only a request that continues a stored
conversation waits, and only for that conversation: a new conversation has nobody to
wait for. A request whose client leaves while it waits stops waiting and is never
sent upstream.

``NamespaceLimits`` bounds what one namespace (one client token) can take: turns in
flight (``--max-concurrent``) and requests per second (``--rate``, a token bucket
whose burst is one second's worth). A refused request is answered 429 with
Retry-After before anything is stored or sent upstream.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

# How often a request waiting for its conversation checks that its client is still there.
_GONE_POLL = 0.25


def namespace_of(request: Request) -> str:
    """The namespace a request belongs to, for limits and metric labels: the one
    ``chatstate.serve._auth`` gave it ("default" for the shared default namespace, and
    for a request refused before it had one)."""
    namespace = getattr(request.state, "namespace", None)
    return namespace if isinstance(namespace, str) and namespace else "default"


class ConversationLocks:
    """One asyncio lock per conversation id, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, key: str, gone: Callable[[], Awaitable[bool]]) -> bool:
        """Wait for ``key``; False (not held) if ``gone()`` says the client left first."""
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        if users == 0:  # nobody holds or waits for it: taken without a turn of the loop
            await lock.acquire()
            return True
        waiting = asyncio.ensure_future(lock.acquire())
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=_GONE_POLL)
                if done:
                    return True
                if await gone():
                    break
        except BaseException:
            self._give_up(key, waiting)
            raise
        self._give_up(key, waiting)
        return False

    def _give_up(self, key: str, waiting: asyncio.Future[Any]) -> None:
        if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
            self.release(key)  # it was granted as we gave up
            return
        waiting.cancel()
        self._forget(key)

    def release(self, key: str) -> None:
        lock, _ = self._locks[key]
        lock.release()
        self._forget(key)

    def _forget(self, key: str) -> None:
        lock, users = self._locks[key]
        if users <= 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


def parse_rate(text: str) -> float:
    """``"5"``, ``"5/s"``, ``"120/min"``, ``"1000/h"`` -> requests per second (> 0)."""
    number, _, unit = text.strip().lower().partition("/")
    per = {"": 1.0, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "hour": 3600.0}
    if unit not in per:
        raise ValueError(f"--rate {text!r}: the unit must be /s, /min or /h (e.g. 120/min)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"--rate {text!r}: not a number of requests (e.g. 120/min)") from None
    if not value > 0 or math.isinf(value):
        raise ValueError(f"--rate {text!r}: must be a positive number of requests")
    return value / per[unit]


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
class NamespaceLimits:
    """Turns in flight and request rate per namespace; None means no limit."""

    max_concurrent: int | None = None
    rate: float | None = None  # requests per second
    _active: dict[str, int] = field(default_factory=dict)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def enter(self, namespace: str) -> tuple[str, int, str] | None:
        """Take a slot, or say why not: (message, seconds to wait, which limit) for a
        429."""
        if self.max_concurrent is not None and \
                self._active.get(namespace, 0) >= self.max_concurrent:
            return (f"too many requests in flight: {self.max_concurrent} at once per client "
                    "(--max-concurrent); retry when one has ended", 1, "concurrency")
        if self.rate is not None:
            wait = self._take(namespace, self.rate)
            if wait:
                return (f"request rate over {_shown(self.rate)} per client (--rate); retry "
                        f"in {wait} s", wait, "rate")
        self._active[namespace] = self._active.get(namespace, 0) + 1
        return None

    def leave(self, namespace: str) -> None:
        left = self._active.get(namespace, 1) - 1
        if left:
            self._active[namespace] = left
        else:
            self._active.pop(namespace, None)

    def _take(self, namespace: str, rate: float) -> int:
        """Seconds until a request is allowed (0: allowed now, and counted)."""
        burst = max(1.0, rate)
        now = time.monotonic()
        bucket = self._buckets.setdefault(namespace, _Bucket(burst, now))
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.stamp) * rate)
        bucket.stamp = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0
        return max(1, math.ceil((1 - bucket.tokens) / rate))


def _shown(rate: float) -> str:
    if rate >= 1:
        return f"{rate:g}/s"
    return f"{rate * 60:g}/min" if rate * 60 >= 1 else f"{rate * 3600:g}/h"
