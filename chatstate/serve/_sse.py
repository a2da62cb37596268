"""Server-sent events cut out of an upstream body as it is read, as bytes.

The relay needs three things of each event: its name (``event:``), its data (the
``data:`` lines joined) and the event's own bytes, which it writes to the client as
they came (``raw``): the proxy parses each event once, to fold it into the reply,
and never encodes it again unless it has to change it (a redacted error event, a
Responses event given what the spec requires). So one network read of the upstream
becomes one list of events, without decoding the body to text, splitting it into
lines and walking each line through a chain of iterators.

Line ends are normalised to ``\\n`` (the spec allows CRLF, LF and CR; a CR that ends a
read waits for the next, which may hold its LF), a byte-order mark opening the stream
is dropped, and blank lines between events are not relayed. An event with no
``data`` line (a comment such as ``: keep-alive``, or ``id:`` alone) is dropped, as it
carries nothing to store. Bytes after the last blank line wait for the next read, in
pieces (a 50 MB event is joined once, not once per read); at the end of the body they
are the last event, if they hold data.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Event", "EventSplitter", "sse_event"]

BOM = b"\xef\xbb\xbf"


class Event(NamedTuple):
    name: str | None  # the ``event:`` field, None when the event has none
    data: bytes  # the ``data:`` lines, joined with ``\n``
    raw: bytes  # the event as relayed: its lines as the upstream sent them, then a blank line


def sse_event(name: str | None, data: str | bytes) -> bytes:
    """One event as written by the proxy (an event it changed, or one of its own)."""
    body = data.encode() if isinstance(data, str) else data
    return (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + body + b"\n\n"


def _parse(block: bytes) -> Event | None:
    """One event from the lines between two blank lines (None: it has no data)."""
    block = block.strip(b"\n")
    if block.startswith(b"data:") and b"\n" not in block:  # the common case: one line
        data = block[5:]
        return Event(None, data[1:] if data[:1] == b" " else data, block + b"\n\n")
    name: str | None = None
    lines: list[bytes] = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value[:1] == b" " else value)
        elif line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
    if not lines:
        return None
    return Event(name, b"\n".join(lines), block + b"\n\n")


def _events(complete: bytes) -> list[Event]:
    events = []
    for block in complete.split(b"\n\n"):
        event = _parse(block)
        if event is not None:
            events.append(event)
    return events


class EventSplitter:
    """Feed the body's reads in order (``feed``), then ``end``; each returns the events
    completed by what it was given."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # read, not yet ending in a blank line
        self._cr = False  # the last read ended with a CR (its LF may open the next)
        self._opening: bytes | None = b""  # the first bytes, until they are not a BOM's

    def feed(self, chunk: bytes) -> list[Event]:
        if self._opening is not None:
            opening = self._opening + chunk
            if len(opening) < len(BOM) and BOM.startswith(opening):
                self._opening = opening
                return []
            chunk, self._opening = opening.removeprefix(BOM), None
        if self._cr:
            chunk, self._cr = b"\r" + chunk, False
        if b"\r" in chunk:
            if chunk.endswith(b"\r"):
                chunk, self._cr = chunk[:-1], True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if not chunk:
            return []
        pending = self._pending
        end = chunk.rfind(b"\n\n")
        if end >= 0:
            complete = b"".join((*pending, chunk[:end])) if pending else chunk[:end]
            rest = chunk[end + 2:]
        elif chunk[:1] == b"\n" and pending and pending[-1][-1:] == b"\n":
            complete, rest = b"".join(pending), chunk[1:]  # the blank line spans two reads
        else:
            pending.append(chunk)
            return []
        self._pending = [rest] if rest else []
        return _events(complete)

    def end(self) -> list[Event]:
        """The events left when the body ended (one without its blank line counts)."""
        rest = (self._opening or b"") + b"".join(self._pending) + (b"\n" if self._cr else b"")
        self._opening, self._pending, self._cr = None, [], False
        return _events(rest.replace(b"\r", b"\n")) if rest else []
