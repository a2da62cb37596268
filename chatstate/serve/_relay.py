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
event data): the relay moves at the client's pace, and a slow reader holds the
upstream back rather than making the proxy buffer its reply. The bound is in bytes
and large enough that a fast stream's group commits stay few (each partial save
writes the reply so far).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from chatstate.adapter import AttemptFailed
from chatstate.adapter.dialects.base import StreamDecoder
from chatstate.adapter.dialects.chat_completions import StreamAccumulator
from chatstate.serve._wires import stored_reply

log = logging.getLogger("chatstate.serve")

_END = object()
RELAY_BUFFER = 8 * 1024 * 1024
"""Bytes of upstream events read ahead of the client at most (one group commit takes
them all)."""


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


async def sse_named(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, str]]:
    """(event name, data) of each server-sent event, for APIs that name their events."""
    name: str | None = None
    data: list[str] = []
    async for line in lines:
        if line == "":
            if data:
                yield name, "\n".join(data)
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield name, "\n".join(data)


def chat_holds(chunk: object) -> bool:
    """A chat-completions chunk that carries a tool-call delta."""
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    delta = choices[0].get("delta") if isinstance(choices, list) and choices and \
        isinstance(choices[0], dict) else None
    return isinstance(delta, dict) and bool(delta.get("tool_calls"))


class StreamRelay:
    """One streamed turn: upstream events in, durable events out."""

    def __init__(self, lines: AsyncIterator[str], *,
                 save_partial: Callable[[str, str | None], Any],
                 commit: Callable[[Mapping[str, Any]], Any],
                 fail: Callable[[str], Any], buffer: int = RELAY_BUFFER,
                 decoder: StreamDecoder | None = None,
                 holds: Callable[[object], bool] = chat_holds,
                 named: bool = False,
                 rewrite: Callable[[str | None, Any], Any] | None = None) -> None:
        """``decoder`` folds the events (chat completions' by default); ``named``: the API
        names its events (Responses, Anthropic), which are relayed with their names and
        end with the reply's finish instead of ``[DONE]``; ``holds``: an event that starts
        a tool call; ``rewrite``: the event as relayed (filling what a spec requires)."""
        self._buffer = buffer
        self._lines = lines
        self._save_partial = save_partial  # blocking store calls, run in a thread
        self._commit = commit
        self._fail = fail
        self._holds = holds
        self._named = named
        self._rewrite = rewrite
        self.acc: StreamDecoder = decoder or StreamAccumulator()
        self.saved = ""
        self.committed = False
        self.holding = False  # a tool-call delta arrived: hold events until the commit
        self.held: list[bytes] = []

    async def events(self) -> AsyncIterator[bytes]:
        # Bounded: a client that reads slowly makes the reader wait, and so the upstream
        # (TCP backpressure), instead of the proxy buffering the whole reply.
        queue: asyncio.Queue[object] = asyncio.Queue()
        held = [0]  # bytes in the queue
        drained = asyncio.Event()

        async def read() -> None:
            try:
                source: AsyncIterator[Any] = sse_named(self._lines) if self._named \
                    else sse_data(self._lines)
                async for data in source:
                    while held[0] >= self._buffer:
                        drained.clear()
                        await drained.wait()
                    held[0] += len(data[1] if isinstance(data, tuple) else data)
                    queue.put_nowait(data)
                end: object = _END
            except Exception as exc:  # the upstream connection broke mid-stream
                end = exc
            queue.put_nowait(end)

        reader = asyncio.create_task(read())
        try:
            ended = False
            while not ended:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                held[0] = 0
                drained.set()
                out: list[bytes] = []
                done = False
                for item in batch:
                    if item is _END or isinstance(item, Exception):
                        ended = True
                        if isinstance(item, Exception):
                            await asyncio.to_thread(self._fail, f"upstream stream broke: {item}")
                        break
                    name, data = item if isinstance(item, tuple) else (None, item)
                    assert isinstance(data, str)
                    if data.strip() == "[DONE]":
                        done = True
                    else:
                        data = self._feed(name, data)
                    event = (f"event: {name}\n" if name else "") + f"data: {data}\n\n"
                    (self.held if self.holding else out).append(event.encode())
                finished = done or ((ended or self._named) and self.acc.finish_reason is not None)
                if finished and not self.committed:
                    await asyncio.to_thread(self._commit, self.reply())
                    self.committed = True
                    out, self.held, self.holding = out + self.held, [], False
                elif self.acc.text != self.saved and not self.committed:
                    await self.save()
                if out:
                    yield b"".join(out)
        finally:
            reader.cancel()

    def _feed(self, name: str | None, data: str) -> str:
        """Fold one event into the reply (holding events from a tool call's first on);
        return its data as relayed."""
        try:
            chunk = json.loads(data)
        except ValueError:
            log.warning("serve: relaying an upstream event that is not JSON: %.80s", data)
            return data
        if self._rewrite is not None:
            chunk = self._rewrite(name, chunk)
            data = json.dumps(chunk)
        try:
            self.acc.feed(chunk)
        except AttemptFailed as exc:  # an error event or a misshapen chunk: relayed as is
            log.warning("serve: upstream stream: %s", exc)
        if self._holds(chunk):
            self.holding = True
        return data

    async def save(self) -> None:
        text = self.acc.text
        await asyncio.to_thread(self._save_partial, text, self.acc.model)
        self.saved = text

    def save_now(self) -> None:
        """Keep what arrived but was not relayed yet (the client went away): blocking."""
        if not self.committed and self.acc.text != self.saved:
            self._save_partial(self.acc.text, self.acc.model)
            self.saved = self.acc.text

    def reply(self) -> dict[str, Any]:
        return stored_reply(self.acc.reply())


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
