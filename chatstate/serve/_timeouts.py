"""Closing connections that hold a slot and send nothing: idle ones and slowloris.

uvicorn closes a keep-alive connection ``timeout_keep_alive`` seconds after a
response, but a connection that never sends a request, or sends its headers a
byte at a time, it keeps forever. ``h11_protocol`` gives its h11 protocol two
more timers: an idle one from the moment a connection opens (the keep-alive
timeout again), and a header one: once a request's first bytes arrive, its
headers must be complete within ``header_timeout`` seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class _TimedH11(H11Protocol):
    header_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        # uvicorn arms its idle timer only after a first response: arm it from the start
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self._between_requests():
            self._header_timer = self.loop.call_later(self.header_timeout, self._too_slow)
        super().data_received(data)
        if self._header_timer is not None and not self._between_requests():
            self._header_timer.cancel()  # the headers are in: a request is running
            self._header_timer = None

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _too_slow(self) -> None:
        self._header_timer = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)


def h11_protocol(header_timeout: float) -> type[Any]:
    """uvicorn's h11 protocol with the idle timer from the start and a header timer."""
    return type("TimedH11Protocol", (_TimedH11,), {"header_timeout": header_timeout})
