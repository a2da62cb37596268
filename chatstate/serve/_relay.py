"""Relaying a streamed reply: each piece is durable before the client sees it.

The upstream's events are read by one task into a queue. The relay takes every
event that has arrived, saves the reply so far as the partial reply (one store
write), and only then writes those events to the client; events that arrive
while a write is in flight go into the next one (group commit). The final
events are written after the reply is committed into the chain. So whatever a
client received is a prefix of what the store holds, and a slow disk makes the
client's stream move in larger steps, not fall behind.

Tool calls are not text: the partial reply holds text only, so once a tool-call
delta arrives, that event and every later one is held back and written after the
commit, which stores the calls whole.

What the reader may hold ahead of the client is bounded (``RELAY_BUFFER`` bytes of
event data, or the length of the reply saved so far if that is more, up to
``READ_AHEAD_MAX`` times that: never more than the reply the relay holds anyway):
the relay moves at the client's pace, and
a slow reader holds the upstream back rather than making the proxy buffer its
reply.

Partial saves are paced so their cost stays in proportion to the reply (each one
writes the whole reply so far): a save waits, after the previous one, as long as
that one took (``PACE`` times, at most ``PACE_MAX`` seconds), and the read-ahead
grows with the reply, so each save carries at least as much new text as it
rewrites. Saves of a short reply take a millisecond, so it still moves piece by
piece; a 50 MB reply is written a handful of times, not once per network read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from chatstate.adapter import AttemptFailed
from chatstate.adapter.dialects.chat_completions import StreamAccumulator

log = logging.getLogger("chatstate.serve")

_END = object()
RELAY_BUFFER = 8 * 1024 * 1024
"""Bytes of upstream events read ahead of the client at most (one group commit takes
them all), unless the reply saved so far is longer."""
READ_AHEAD_MAX = 4
"""... and never more than this many times ``RELAY_BUFFER``."""
PACE = 1.0
"""After a partial save that took ``d`` seconds, the next waits ``PACE * d``."""
PACE_MAX = 0.5
"""... but never longer than this many seconds."""


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event (multi-line data joined, comments dropped)."""
    data: list[str] = []
    async for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


class StreamRelay:
    """One streamed turn: upstream events in, durable events out."""

    def __init__(self, lines: AsyncIterator[str], *,
                 save_partial: Callable[[str, str | None], Any],
                 commit: Callable[[Mapping[str, Any]], Any],
                 fail: Callable[[str], Any], buffer: int = RELAY_BUFFER) -> None:
        self._buffer = buffer
        self._lines = lines
        self._save_partial = save_partial  # blocking store calls, run in a thread
        self._commit = commit
        self._fail = fail
        self.acc = StreamAccumulator()
        self.saved = ""
        self.grown = False  # text arrived since the last save
        self._next_save = 0.0  # monotonic time before which no partial save starts
        self.committed = False
        self.holding = False  # a tool-call delta arrived: hold events until the commit
        self.held: list[bytes] = []

    async def events(self) -> AsyncIterator[bytes]:
        # Bounded: a client that reads slowly makes the reader wait, and so the upstream
        # (TCP backpressure), instead of the proxy buffering the whole reply.
        queue: asyncio.Queue[object] = asyncio.Queue()
        held = [0]  # bytes in the queue
        drained = asyncio.Event()
        full = asyncio.Event()  # the reader waits for room

        async def read() -> None:
            try:
                async for data in sse_data(self._lines):
                    while held[0] >= min(max(self._buffer, len(self.saved)),
                                         READ_AHEAD_MAX * self._buffer):
                        drained.clear()
                        full.set()  # a paced save need wait no longer: nothing more comes
                        await drained.wait()
                    held[0] += len(data)
                    queue.put_nowait(data)
                end: object = _END
            except Exception as exc:  # the upstream connection broke mid-stream
                end = exc
            queue.put_nowait(end)

        reader = asyncio.create_task(read())
        loop = asyncio.get_running_loop()
        try:
            ended = False
            while not ended:
                pause = self._next_save - loop.time()
                if pause > 0 and not full.is_set():
                    # what arrives meanwhile joins the next save (until the read-ahead is full)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(full.wait(), pause)
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                held[0] = 0
                full.clear()
                drained.set()
                out: list[bytes] = []
                done = False
                for item in batch:
                    if item is _END or isinstance(item, Exception):
                        ended = True
                        if isinstance(item, Exception):
                            await asyncio.to_thread(self._fail, f"upstream stream broke: {item}")
                        break
                    assert isinstance(item, str)
                    if item.strip() == "[DONE]":
                        done = True
                    elif self._feed(item) and not self.holding:
                        self.holding = True
                    event = f"data: {item}\n\n".encode()
                    (self.held if self.holding else out).append(event)
                finished = done or (ended and self.acc.finish_reason is not None)
                if finished and not self.committed:
                    await asyncio.to_thread(self._commit, self.reply())
                    self.committed = True
                    out, self.held, self.holding = out + self.held, [], False
                elif self.grown and not self.committed:
                    started = loop.time()
                    await self.save()
                    spent = loop.time() - started
                    self._next_save = loop.time() + min(PACE * spent, PACE_MAX)
                if out:
                    yield b"".join(out)
        finally:
            reader.cancel()

    def _feed(self, data: str) -> bool:
        """Fold one event into the reply; True when it carries a tool-call delta."""
        try:
            chunk = json.loads(data)
        except ValueError:
            log.warning("serve: relaying an upstream event that is not JSON: %.80s", data)
            return False
        try:
            if self.acc.feed(chunk):
                self.grown = True
        except AttemptFailed as exc:  # an error event or a misshapen chunk: relayed as is
            log.warning("serve: upstream stream: %s", exc)
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        delta = choices[0].get("delta") if isinstance(choices, list) and choices and \
            isinstance(choices[0], dict) else None
        return isinstance(delta, dict) and bool(delta.get("tool_calls"))

    async def save(self) -> None:
        text, self.grown = self.acc.text, False
        try:
            await asyncio.to_thread(self._save_partial, text, self.acc.model)
        except BaseException:
            self.grown = True
            raise
        self.saved = text

    def save_now(self) -> None:
        """Keep what arrived but was not relayed yet (the client went away): blocking."""
        if not self.committed and self.grown:
            text, self.grown = self.acc.text, False
            self._save_partial(text, self.acc.model)
            self.saved = text

    def reply(self) -> dict[str, Any]:
        r = self.acc.reply()
        fields: dict[str, Any] = {"content": r.text, "model": r.model, "usage": r.usage}
        if r.tool_calls:
            fields["tool_calls"] = r.tool_calls
        if r.extra:
            fields["extra"] = r.extra
        if r.finish_reason not in (None, "stop", "tool_calls"):
            fields["finish_reason"] = r.finish_reason
        return fields


class RelayResponse(StreamingResponse):
    """A streaming response whose clean-up runs however the response ends.

    Starlette does not close the body iterator when the client disconnects, and
    never starts it if the client is gone first; the turn's lock and upstream
    connection must be released in every case.
    """

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], Any],
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._iterator = content
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self._iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            await self._cleanup()
