"""An upstream that streams one long chat-completions reply as fast as the socket takes it.

The fake model paces its chunks; this one writes ``x`` * ``PIECE`` deltas back to back
until the reply's text is ``size`` characters, then ``finish_reason`` ``stop`` and
``[DONE]``: what a fast provider does with a very long answer. A request whose last
message is ``"small"`` gets a one-chunk reply (to warm a proxy up). It runs on
127.0.0.1: in a thread of the caller (``big_stream_upstream``, for tests) or as a
process of its own (``python -m chatstate.testing.big_stream SIZE``, for ``bench/``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

PIECE = 4000


def chunk(text: str, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 0,
            "model": "big", "choices": [{"index": 0, "delta": {"content": text} if text else {},
                                         "finish_reason": finish}]}
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  size: int) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    request = json.loads(await reader.readexactly(length))
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"connection: close\r\n\r\n")
    if request["messages"][-1]["content"] == "small":
        writer.write(chunk("ok"))
    else:
        piece, sent = chunk("x" * PIECE), 0
        while sent < size:
            writer.write(piece)
            sent += PIECE
            await writer.drain()
    writer.write(chunk("", "stop") + b"data: [DONE]\n\n")
    await writer.drain()
    writer.close()


async def _serve(size: int, started: Callable[[int], None]) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(r, w, size), "127.0.0.1", 0)
    started(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


@contextmanager
def big_stream_upstream(size: int) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT/v1``) of an upstream whose streamed replies
    hold ``size`` characters (a multiple of ``PIECE``, rounded up)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    port: list[int] = []

    def up(at: int) -> None:
        port.append(at)
        started.set()

    task: list[asyncio.Task[None]] = []

    def main() -> None:
        asyncio.set_event_loop(loop)
        task.append(loop.create_task(_serve(size, up)))
        with suppress(asyncio.CancelledError):
            loop.run_until_complete(task[0])

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the big-stream upstream did not start")
    try:
        yield f"http://127.0.0.1:{port[0]}/v1"
    finally:
        loop.call_soon_threadsafe(task[0].cancel)
        thread.join(30)


def main() -> None:
    """``python -m chatstate.testing.big_stream SIZE``: serve until killed, after printing
    ``serving on URL``."""
    size = int(sys.argv[1])

    def up(port: int) -> None:
        print(f"serving on http://127.0.0.1:{port}/v1", flush=True)

    asyncio.run(_serve(size, up))


if __name__ == "__main__":
    main()
