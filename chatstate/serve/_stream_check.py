"""Is the upstream's 200 to a streamed request an event stream at all?

A captive portal, a misrouted load balancer or a server that ignores ``stream``
answers 200 with an HTML page or a JSON body. Relayed as a stream, that gives
the client an empty 200 and the store nothing. So before the client's response
starts, the first line of the body is read: an event stream opens with an SSE
field (``data:``, ``event:``, ``id:``, ``retry:``) or a comment (``:``). Anything
else, an empty body, or a connection that breaks before a line, is a 502 the
proxy can still answer in JSON, with the conversation header, and record.

The body's lines are split as the SSE spec splits them (``sse_lines``), not by
httpx2's ``aiter_lines``, which follows ``str.splitlines``.
"""

from __future__ import annotations

import codecs
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
    lines = sse_lines(resp.aiter_bytes())
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


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of an event stream read in ``chunks``: each ended by CRLF, LF or CR, as
    the SSE spec says, and decoded as UTF-8 (bytes that are not: U+FFFD, as httpx2 does).

    Not ``str.splitlines``, which also ends a line at U+2028, U+2029, U+0085 and a few
    control characters: a server that writes its JSON as UTF-8 (llama.cpp's, vLLM) sends
    those raw inside an event's data, and the event would be cut in two there."""
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    parts: list[str] = []  # the line being read (a long one is joined once, not per read)
    cr = False  # the last read ended with a CR: the first half of a CRLF, perhaps
    async for chunk in chunks:
        text = decode(chunk)
        if cr:
            text, cr = "\r" + text, False
        if text.endswith("\r"):
            text, cr = text[:-1], True
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if "\n" not in text:
            if text:
                parts.append(text)
            continue
        lines = text.split("\n")
        parts.append(lines[0])
        lines[0] = "".join(parts)
        last = lines.pop()
        parts = [last] if last else []
        for line in lines:
            yield line
    tail = decode(b"", final=True)
    if tail:
        parts.append(tail)
    if parts or cr:  # a last line without its end, or ended by a lone CR
        yield "".join(parts)
