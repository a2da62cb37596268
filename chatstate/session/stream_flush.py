"""Group commit for a streamed reply: a slow disk must not throttle the stream.

A reader thread pulls the model's events into a buffer while the turn's own
thread writes the partial reply. Each write carries everything that arrived
since the previous one started, so:

- on a fast disk a write finishes before the next delta arrives, and every
  delta is written (and shown) on its own, as before;
- on a slow disk the deltas that arrive during one write are coalesced into
  the next, so the display moves in larger steps but never lags the stream by
  more than one write, and the stream is never held back by the disk.

The buffer only ever grows by appending, and ``arrived()`` is everything the
model sent so far, whatever instant an interrupt lands at: a turn that ends
early (Ctrl-C, a closed generator, a model error) stores exactly that.

``ceiling`` (the old fixed flush interval, e.g. 0.25 s for object stores where a
write is a request) is a minimum spacing between writes: text that arrives
within it waits for it to pass, or goes with the final commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator


class GroupCommit:
    """Iterate to get what to write next: the whole text arrived so far (``str``),
    or the stream's final non-text event (the completion), after which it stops.

    The model's error, if its stream fails, is raised from the iteration; the text
    that arrived before it is still in ``arrived()``.
    """

    def __init__(self, events: Iterator[object], ceiling: float = 0.0) -> None:
        self._events = events
        self._ceiling = ceiling
        self._cond = threading.Condition()
        self._chunks: list[str] = []
        self._joined = ""  # cache: "".join(self._chunks[:self._joined_n])
        self._joined_n = 0
        self._taken = 0  # characters handed out for writing
        self._final: object | None = None
        self._error: BaseException | None = None
        self._ended = False
        self._stop = False
        self._done = False
        self._waiting = False  # the turn's thread is waiting for text
        self._first_write = False  # the first text was handed out and is being written
        self._last_take = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="chatstate-stream-reader",
                                         daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for event in self._events:
                with self._cond:
                    if self._stop:
                        break
                    if isinstance(event, str):
                        if event:
                            self._chunks.append(event)
                    else:
                        self._final = event
                    self._cond.notify_all()
                    # Parsing a stream that is already buffered keeps this thread busy,
                    # and the GIL would hold up the turn's thread for milliseconds at
                    # every step of its write. So: hand text to a waiting turn at once,
                    # and let the first write run alone (later ones are coalesced).
                    if self._waiting:
                        self._cond.wait_for(lambda: not self._waiting or self._stop, 0.005)
                    if self._first_write:
                        self._cond.wait_for(lambda: not self._first_write or self._stop, 0.1)
        except BaseException as exc:  # handed to the turn's thread, which raises it
            with self._cond:
                self._error = exc
        finally:
            close = getattr(self._events, "close", None)
            if close is not None:
                close()  # here, not from another thread: a running generator cannot be closed
            with self._cond:
                self._ended = True
                self._cond.notify()

    def arrived(self) -> str:
        """All the text the model has sent so far."""
        with self._cond:
            return self._text()

    def _text(self) -> str:
        if self._joined_n < len(self._chunks):
            self._joined += "".join(self._chunks[self._joined_n:])
            self._joined_n = len(self._chunks)
        return self._joined

    def __iter__(self) -> Iterator[object]:
        return self

    def __next__(self) -> object:
        with self._cond:
            if self._first_write:  # it is done: the reader may go on
                self._first_write = False
                self._cond.notify_all()
            while not self._done:
                text = self._text()
                if len(text) > self._taken:
                    wait = self._last_take + self._ceiling - time.monotonic()
                    if wait <= 0:  # what arrived before an error is still written first
                        self._first_write = self._taken == 0
                        self._taken, self._last_take = len(text), time.monotonic()
                        return text
                    if self._final is None and not self._ended:
                        self._cond.wait(wait)  # the ceiling: no hand-over wanted
                        continue
                if self._error is not None:
                    self._done = True
                    raise self._error
                if self._final is not None:
                    self._stop = self._done = True
                    return self._final
                if self._ended:
                    break
                self._wait(None)
            raise StopIteration

    def _wait(self, timeout: float | None) -> None:
        self._waiting = True
        try:
            self._cond.wait(timeout)
        finally:
            self._waiting = False
            self._cond.notify_all()  # a reader handing over text waits for this

    def close(self) -> None:
        """Stop reading: the reader closes the model's stream at its next event."""
        with self._cond:
            self._stop = True
