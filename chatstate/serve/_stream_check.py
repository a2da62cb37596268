"""Is the upstream's 200 to a streamed request an event stream at all?

A captive portal, a misrouted load balancer or a server that ignores ``stream``
answers 200 with an HTML page or a JSON body. Relayed as a stream, that gives
the client an empty 200 and the store nothing. So before the client's response
starts, the body is read up to its first line that is not blank: an event stream
opens with an SSE field (``data:``, ``event:``, ``id:``, ``retry:``) or a comment
(``:``). Anything else, an empty body, or a connection that breaks before a line,
is a 502 the proxy can still answer in JSON, with the conversation header, and
record. What was read is handed on as it came (the relay cuts it into events).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx2

from chatstate.core.redact import scrub

SSE_FIELDS = ("data:", "event:", "id:", "retry:", ":")
SHOWN = 200  # characters of a body that is not an event stream, in the error
_LINES = re.compile(rb"\r\n|\r|\n")


def _first_line(head: bytes, ended: bool) -> str | None:
    """The first line of ``head`` that is not blank, once it is whole (or the body
    ended, or enough of it is there to show); "" : there is none; None: read on."""
    lines = _LINES.split(head.removeprefix(b"\xef\xbb\xbf"))
    whole = lines if ended else lines[:-1]  # the last one may go on in the next read
    for line in whole:
        if line.strip():
            return line.decode("utf-8", "replace")
    if not ended and len(lines[-1]) >= 4 * SHOWN:
        return lines[-1].decode("utf-8", "replace")
    return "" if ended else None


async def event_stream(resp: httpx2.Response, *secrets: str | None
                       ) -> tuple[AsyncIterator[bytes], bytes, str | None]:
    """(the rest of the body as read, what was read of it, why it is not an event
    stream or None).

    The body is read raw when it is not compressed (no decoding layer per read). When
    it is not an event stream, ``resp`` is closed and the reason is redacted (it quotes
    the body).
    """
    encoded = resp.headers.get("content-encoding", "identity").strip().lower()
    chunks = resp.aiter_raw() if encoded in ("", "identity") else resp.aiter_bytes()
    head = b""
    first = None
    try:
        async for chunk in chunks:
            head += chunk
            first = _first_line(head, False)
            if first is not None:
                break
        else:
            first = _first_line(head, True) or None
    except httpx2.HTTPError as exc:
        await resp.aclose()
        return chunks, head, (f"the upstream stream broke before its first event "
                              f"({type(exc).__name__}: {exc})")
    kind = resp.headers.get("content-type") or "no Content-Type"
    problem = None
    if first is None:
        problem = f"the upstream answered a streamed request with an empty body ({kind})"
    elif not first.startswith(SSE_FIELDS):
        problem = (f"the upstream answered a streamed request with {kind}, not an event "
                   f"stream: {scrub(first[:SHOWN], *secrets, limit=None)!r}")
    if problem is not None:
        await resp.aclose()
    return chunks, head, problem
