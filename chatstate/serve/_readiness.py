"""``/readyz``'s store probe, run at most once per ``interval`` however often it is asked.

The probe writes, reads back and deletes in the real store (an fsync on a local
one), so an unauthenticated loop on ``/readyz`` made every client slower. Callers
within ``interval`` of the last probe get its result; callers during a probe wait
for that one instead of starting another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from chatstate.stores.base import CheckReport, Store


class Readiness:
    def __init__(self, store: Store, interval: float, probed: Callable[[], None]) -> None:
        self.store, self.interval, self._probed = store, interval, probed
        self._last: tuple[float, CheckReport] | None = None
        self._running: asyncio.Future[CheckReport] | None = None

    async def check(self) -> CheckReport:
        if self._last is not None and time.monotonic() - self._last[0] < self.interval:
            return self._last[1]
        if self._running is None:
            self._running = asyncio.ensure_future(self._probe())
            self._running.add_done_callback(self._clear)
        return await asyncio.shield(self._running)

    async def _probe(self) -> CheckReport:
        self._probed()
        report = await asyncio.to_thread(self.store.check)
        self._last = (time.monotonic(), report)
        return report

    def _clear(self, _: object) -> None:
        self._running = None
