"""The proxy's line reader of an upstream event stream (``_stream_check.sse_lines``).

It splits a body at ``\\n``, ``\\r\\n`` and ``\\r`` and nowhere else, wherever the
network cut the body into chunks: a ``\\r\\n`` split between two reads is one line
break, a character of several UTF-8 bytes split between two reads is one character,
and U+2028 inside a JSON string (which ``str.splitlines`` would split at) stays in its
line. Each body is fed cut at every position, and in single bytes, and must give the
lines the spec's split of the whole text gives.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest

from chatstate.serve._stream_check import sse_lines

BODIES = [
    b'data: {"a": 1}\n\ndata: {"b": 2}\n\n',
    b'data: {"a": 1}\r\n\r\ndata: [DONE]\r\n\r\n',
    b"data: one\rdata: two\r\r",
    b"event: message_start\ndata: {}\n\n: a comment\ndata: x\n",
    'data: {"content": "caf\u00e9 \u2028 \u65e5\u672c \U0001F600"}\n\n'.encode(),
    b"data: no final newline",
    b"data: bad \xff\xfe bytes\n\n",
    b"\r\n\r\n\n\r",
    b"",
]


def expected(body: bytes) -> list[str]:
    text = body.decode("utf-8", "replace")
    lines = re.split(r"\r\n|\r|\n", text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def lines_of(parts: list[bytes]) -> list[str]:
    async def run() -> list[str]:
        return [line async for line in sse_lines(_chunks(parts))]
    return asyncio.run(run())


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_lines_are_the_specs_split_wherever_the_body_is_cut(body: bytes) -> None:
    want = expected(body)
    assert lines_of([body]) == want
    assert lines_of([body[i:i + 1] for i in range(len(body))]) == want  # a byte at a time
    for cut in range(len(body) + 1):
        assert lines_of([body[:cut], b"", body[cut:]]) == want, cut


def test_u2028_inside_a_json_string_stays_in_its_line() -> None:
    body = 'data: {"t": "a\u2028b\u2029c\x85d"}\n\n'.encode()
    assert lines_of([body]) == ['data: {"t": "a\u2028b\u2029c\x85d"}', ""]
