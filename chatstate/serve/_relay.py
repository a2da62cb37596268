"""Relaying a streamed reply: each piece is durable before the client sees it.

The upstream's events are read by one task into a queue. The relay takes every
event that has arrived, saves the reply so far as the partial reply (one store
write), and only then writes those events to the client; events that arrive
while a write is in flight go into the next one (group commit). The final
events are written after the reply is committed into the chain. So whatever a
client received is a prefix of what the store holds, and a slow disk makes the
client's stream move in larger steps, not fall behind.

A stream that fails after it began (the upstream connection breaks, or its body
ends with no finish_reason and no ``[DONE]``, or it sends an ``{"error": ...}``
event) is a failure, never a complete reply: the text so far is saved as the
partial reply, the failure is recorded (``fail``) and only then does the client get
the error events of its API (the upstream's own, held from the error event on until
the end of its body, or the proxy's: ``_stream_events``), so its SDK fails as it would
have against the upstream directly.

Tool calls are not text: the partial reply holds text only, so once a tool-call
delta arrives, that event and every later one is held back and written after the
commit, which stores the calls whole.

What the reader may hold ahead of the client is bounded (``RELAY_BUFFER`` bytes of
event data while the reply is short, then the length of the reply saved so far, up to
``READ_AHEAD_MAX`` times ``RELAY_BUFFER``: never more than the reply the relay holds
anyway), counting every byte read and not yet handed to the client, whether queued or
being written: the relay moves at the client's pace, and a slow reader holds the
upstream back rather than making the proxy buffer its reply. Events are handed over in
pieces of at most ``WRITE_PIECE`` bytes, each let go once written, and the reply's text
is kept once (the decoder's pieces collapse into the string each save joins).

Partial saves are paced so their cost stays in proportion to the reply (each one
writes the whole reply so far): a save waits, after the previous one, as long as
that one took (``PACE`` times, at most ``PACE_MAX`` seconds); once the reply is past
``SMALL_REPLY``, it waits until as much new text has arrived as it rewrites (the
read-ahead then grows with the reply), or ``PACE_MAX``. Saves of a short reply take a
millisecond, so it still moves piece by piece; a 50 MB reply is written a handful of
times, not once per network read, whatever the machine's load.
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
from chatstate.adapter.dialects.base import StreamDecoder
from chatstate.adapter.dialects.chat_completions import StreamAccumulator
from chatstate.serve._stream_events import StreamEvents
from chatstate.serve._wires import stored_reply

log = logging.getLogger("chatstate.serve")

_END = object()
RELAY_BUFFER = 8 * 1024 * 1024
"""Bytes of upstream events read ahead of the client at most (one group commit takes
them all), unless the reply saved so far is longer."""
WRITE_PIECE = 1024 * 1024
"""Bytes of events handed to the client at a time."""
READ_AHEAD_MAX = 4
"""... and never more than this many times ``RELAY_BUFFER``."""
PACE = 1.0
"""After a partial save that took ``d`` seconds, the next waits ``PACE * d``."""
PACE_MAX = 0.5
"""... but never longer than this many seconds."""
SMALL_REPLY = 64 * 1024
"""Beyond this many characters saved, a partial save waits until as much new text has
arrived as it would rewrite (or ``PACE_MAX``): the saves' sizes double, so what they
write stays within a few times the reply, however fast the upstream and however loaded
the machine."""


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


def _size(item: object) -> int:
    """Bytes an event read from the upstream counts for, against the read-ahead."""
    return len(item[1] if isinstance(item, tuple) else item)  # type: ignore[arg-type]


def _event(name: str | None, data: str) -> bytes:
    """One event as relayed."""
    return ((f"event: {name}\n" if name else "") + f"data: {data}\n\n").encode()


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
                 fail: Callable[[int, str], Any], buffer: int = RELAY_BUFFER,
                 redact: Callable[[str], str] = str,
                 decoder: StreamDecoder | None = None,
                 holds: Callable[[object], bool] = chat_holds,
                 named: bool = False,
                 rewrite: Callable[[str | None, Any], Any] | None = None,
                 failures: StreamEvents | None = None) -> None:
        """``decoder`` folds the events (chat completions' by default); ``named``: the API
        names its events (Responses, Anthropic), which are relayed with their names and
        end with the reply's finish instead of ``[DONE]``; ``holds``: an event that starts
        a tool call; ``rewrite``: the event as relayed (filling what a spec requires);
        ``failures``: the API's error events, read and written (chat completions')."""
        self._buffer = buffer
        self._lines = lines
        self._save_partial = save_partial  # blocking store calls, run in a thread
        self._commit = commit
        self._fail = fail  # (status, detail): record why the turn has no complete reply
        self._redact = redact  # the one redactor, for error events (they may echo a key)
        self._holds = holds
        self._named = named
        self._rewrite = rewrite
        self._failures = failures or StreamEvents()
        self.acc: StreamDecoder = decoder or StreamAccumulator()
        self.saved_chars = 0  # characters of the reply saved so far
        self.grown = False  # text arrived since the last save
        self._next_save = 0.0  # monotonic time before which no partial save starts
        self.committed = False
        self.holding = False  # a tool-call delta arrived: hold events until the commit
        self.held: list[bytes] = []
        self.failed: str | None = None  # why the stream failed, once recorded
        self.upstream_error: tuple[int, str] | None = None  # an error event it relayed
        self.after_error: list[bytes] = []  # events from it on, written after the record
        self.broke: BaseException | None = None  # the relay itself failed (the store)

    async def events(self) -> AsyncIterator[bytes]:
        # Bounded: a client that reads slowly makes the reader wait, and so the upstream
        # (TCP backpressure), instead of the proxy buffering the whole reply. What counts
        # is every byte read and not yet handed to the client, queued or being written.
        queue: asyncio.Queue[object] = asyncio.Queue()
        held = [0]  # bytes of events read and not yet handed to the client
        drained = asyncio.Event()
        full = asyncio.Event()  # the reader waits for room

        async def read() -> None:
            try:
                source: AsyncIterator[Any] = sse_named(self._lines) if self._named \
                    else sse_data(self._lines)
                async for data in source:
                    while held[0] >= self._read_ahead():
                        drained.clear()
                        full.set()  # a paced save need wait no longer: nothing more comes
                        await drained.wait()
                    held[0] += _size(data)
                    queue.put_nowait(data)
                end: object = _END
            except Exception as exc:  # the upstream connection broke mid-stream
                end = exc
            queue.put_nowait(end)
            full.set()  # nothing more comes: a paced save waits no longer for it

        def handed(size: int) -> None:
            held[0] -= size
            if held[0] < self._read_ahead():
                drained.set()

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
                full.clear()
                out: list[tuple[str | None, str, int]] = []  # (name, data, size read)
                done = False
                broke: Exception | None = None
                for item in batch:
                    if item is _END or isinstance(item, Exception):
                        ended = True
                        broke = item if isinstance(item, Exception) else None
                        break
                    size = _size(item)
                    name, data = item if isinstance(item, tuple) else (None, item)
                    assert isinstance(data, str)
                    if data.strip() == "[DONE]":
                        done = True
                    else:
                        data = self._feed(name, data)
                    if self.upstream_error is not None:
                        # from the error event on, held until the failure is recorded (a
                        # client's SDK raises on it and leaves); the key stays out
                        self.after_error.append(_event(name, self._redact(data)))
                        handed(size)
                    elif self.holding:
                        self.held.append(_event(name, data))
                        handed(size)
                    else:
                        out.append((name, data, size))
                del batch, item  # the events live on in ``out`` only, until written
                # a named API (Responses, Anthropic) ends with its reply's finish, no [DONE]
                finished = (done or (((ended and broke is None) or self._named)
                                     and self.acc.finish_reason is not None)) \
                    and self.upstream_error is None
                tail = b""
                if (ended or done) and not finished and not self.committed:
                    closing = await self._failure(broke)
                    tail, self.after_error = b"".join(self.after_error) + closing, []
                    ended = True
                elif finished and not self.committed:
                    await asyncio.to_thread(self._commit, self.reply())
                    self.committed = True
                    tail, self.held, self.holding = b"".join(self.held), [], False
                elif self.grown and not self.committed:
                    started = loop.time()
                    await self.save()
                    spent = loop.time() - started
                    # a long reply: the next save waits for the read-ahead (as much new
                    # text as it rewrites) to fill, or PACE_MAX
                    pause = PACE_MAX if self.saved_chars > SMALL_REPLY else PACE * spent
                    self._next_save = loop.time() + min(pause, PACE_MAX)
                # written in pieces of at most WRITE_PIECE bytes, each let go once handed
                # over: the events are not copied whole into one buffer
                out.reverse()
                while out:
                    piece, sizes = [], 0
                    while out and sizes < WRITE_PIECE:
                        name, data, size = out.pop()
                        piece.append(_event(name, data))
                        sizes += size
                    if not out and tail:
                        piece.append(tail)
                        tail = b""
                    chunk = b"".join(piece)
                    del piece
                    yield chunk
                    del chunk
                    handed(sizes)
                if tail:
                    yield tail
        except Exception as exc:
            self.broke = exc
            raise
        finally:
            reader.cancel()

    def _read_ahead(self) -> int:
        """Bytes of events the reader may hold ahead of the client: ``RELAY_BUFFER`` while
        the reply is short; beyond ``SMALL_REPLY``, as much as the reply saved so far (so
        each save carries as much new text as it rewrites), at most ``READ_AHEAD_MAX``
        times ``RELAY_BUFFER``."""
        saved = self.saved_chars
        if saved <= SMALL_REPLY:
            return self._buffer
        return min(saved, READ_AHEAD_MAX * self._buffer)

    async def _failure(self, broke: Exception | None) -> bytes:
        """Keep the text so far as partial, record why, and return what ends the client's
        stream in its API's shape (only what the upstream's own error events left out)."""
        if self.grown:
            await self.save()
        if self.upstream_error is not None:
            status, detail = self.upstream_error
            self.failed = f"upstream error event mid-stream: {detail}"
        else:
            status = 502
            if broke is not None:
                why = f"the upstream stream broke ({type(broke).__name__}: {broke})"
            else:
                why = "the upstream stream ended without a finish_reason or [DONE]"
            self.failed = (f"{why} after {len(self.acc.text)} characters; they are kept as "
                           "the partial reply")
        await asyncio.to_thread(self._fail, status, self.failed)
        message = self.upstream_error[1] if self.upstream_error is not None else self.failed
        return self._failures.closing(status, self._redact(message), self.acc.text)

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
        error = self._failures.see(name, chunk)
        if error is not None and self.upstream_error is None:
            self.upstream_error = error[0], self._redact(error[1])
        try:
            if self.acc.feed(chunk):
                self.grown = True
        except AttemptFailed as exc:  # an error event or a misshapen chunk: relayed as is
            log.warning("serve: upstream stream: %s", exc)
        if self._holds(chunk):
            self.holding = True
        return data

    async def save(self) -> None:
        text, self.grown = self.acc.text, False
        try:
            await asyncio.to_thread(self._save_partial, text, self.acc.model)
        except BaseException:
            self.grown = True
            raise
        self.saved_chars = len(text)

    def save_now(self) -> None:
        """Keep what arrived but was not relayed yet (the client went away): blocking."""
        if not self.committed and self.grown:
            text, self.grown = self.acc.text, False
            self._save_partial(text, self.acc.model)
            self.saved_chars = len(text)

    def reply(self) -> dict[str, Any]:
        return stored_reply(self.acc.reply())


def client_failure(relay: StreamRelay) -> tuple[int, str]:
    """(status, detail) to record for a stream that ended on the client's side: it went
    away (499, as nginx logs it), or the relay failed writing the store (500)."""
    kept = f"{relay.saved_chars} characters are kept as the partial reply"
    if relay.broke is not None:
        return 500, f"the relay failed mid-stream ({type(relay.broke).__name__}: " \
            f"{relay.broke}); {kept}"
    return 499, f"the client disconnected mid-stream; {kept}"


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
