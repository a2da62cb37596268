"""Is the upstream's 200 to a streamed request an event stream at all?

A captive portal, a misrouted load balancer or a server that ignores ``stream``
answers 200 with an HTML page or a JSON body. Relayed as a stream, that gives
the client an empty 200 and the store nothing. So before the client's response
starts, the first line of the body is read: an event stream opens with an SSE
field (``data:``, ``event:``, ``id:``, ``retry:``) or a comment (``:``). Anything
else, an empty body, or a connection that breaks before a line, is a 502 the
proxy can still answer in JSON, with the conversation header, and record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2

from chatstate.core.redact import scrub

SSE_FIELDS = ("data:", "event:", "id:", "retry:", ":")
SHOWN = 200  # characters of a body that is not an event stream, in the error


async def event_stream(resp: httpx2.Response, *secrets: str | None
                       ) -> tuple[AsyncIterator[str], str | None]:
    """(the body's lines, the first one put back; why it is not an event stream or None).

    When it is not one, ``resp`` is closed and the reason is redacted (it quotes the body).
    """
    lines = resp.aiter_lines()
    seen: list[str] = []
    first = None
    try:
        async for line in lines:
            seen.append(line)
            if line.strip():
                first = line
                break
    except httpx2.HTTPError as exc:
        await resp.aclose()
        return lines, (f"the upstream stream broke before its first event "
                       f"({type(exc).__name__}: {exc})")
    kind = resp.headers.get("content-type") or "no Content-Type"
    problem = None
    if first is None:
        problem = f"the upstream answered a streamed request with an empty body ({kind})"
    elif not first.lstrip("\ufeff").startswith(SSE_FIELDS):
        problem = (f"the upstream answered a streamed request with {kind}, not an event "
                   f"stream: {scrub(first[:SHOWN], *secrets, limit=None)!r}")
    if problem is not None:
        await resp.aclose()
        return lines, problem

    async def again() -> AsyncIterator[str]:
        for line in seen:
            yield line
        async for line in lines:
            yield line

    return again(), None
