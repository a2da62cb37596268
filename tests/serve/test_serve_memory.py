"""Memory of ``chatstate serve`` relaying a large reply to a slow reader (issue 22, item 7).

A real serve process relays a ``REPLY_MB`` MB streamed reply from an upstream of this
test's own (SSE as fast as the socket takes it) to a client that stops reading for a
while, then reads the rest. The process's peak RSS (VmHWM, from /proc) must grow by
less than ``BOUND`` times the reply: the relay moves at the client's pace and does not
keep copies of the reply beyond what its partial saves need. The whole reply must
reach the client and be stored complete.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.serve_helpers import ServeProcess, local_url, serve_env

from chatstate.stores import open_store

REPLY_MB = 20
BOUND = 3.0
"""Peak RSS growth, in times the reply (main: 11.1 times on sqlite, 11.7 on json)."""
PIECE = "x" * 4000


def _event(text: str, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 0,
            "model": "big", "choices": [{"index": 0, "delta": {"content": text} if text
                                         else {}, "finish_reason": finish}]}
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


@pytest.fixture
def big_upstream() -> Iterator[str]:
    """An upstream that streams REPLY_MB MB of text in 4,000-character pieces."""
    size = REPLY_MB * 1000 * 1000
    loop = asyncio.new_event_loop()
    started = threading.Event()
    port: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"connection: close\r\n\r\n")
        piece, sent = _event(PIECE), 0
        while sent < size:
            writer.write(piece)
            sent += len(PIECE)
            await writer.drain()
        writer.write(_event("", "stop") + b"data: [DONE]\n\n")
        await writer.drain()
        writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        started.set()
        await server.serve_forever()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert started.wait(30)
    yield f"http://127.0.0.1:{port[0]}/v1"
    loop.call_soon_threadsafe(loop.stop)


def _status(pid: int, field: str) -> int:
    """A /proc/PID/status field, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _slow_read(base_url: str, stall: float) -> bytes:
    """One streamed request whose reader stops for ``stall`` seconds after the first
    bytes, then reads the rest; the whole response."""
    host, port = base_url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
    body = json.dumps({"model": "big", "stream": True,
                       "messages": [{"role": "user", "content": "a big one"}]}).encode()
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host.encode() +
                 b"\r\ncontent-type: application/json\r\ncontent-length: " +
                 str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
    got = [sock.recv(65536)]
    time.sleep(stall)
    while data := sock.recv(1 << 20):
        got.append(data)
    sock.close()
    return b"".join(got)


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_a_slow_reader_of_a_large_reply_keeps_serve_memory_bounded(
        tmp_path: Path, big_upstream: str, kind: str) -> None:
    reply = REPLY_MB * 1000 * 1000
    url = local_url(kind, tmp_path)
    with ServeProcess(url, big_upstream, serve_env(tmp_path)) as serve:
        pid = serve.proc.pid
        before = _status(pid, "VmHWM")
        response = _slow_read(serve.base_url, stall=3.0)
        grown = _status(pid, "VmHWM") - before
        serve.terminate()
    assert response.startswith(b"HTTP/1.1 200"), response[:300]
    assert response.count(PIECE.encode()) == reply // len(PIECE)
    assert b"data: [DONE]" in response
    store = open_store(url)
    try:
        [summary] = store.list_conversations()
        stored = store.load(summary.id).messages[-1]
    finally:
        store.close()
    assert stored.role == "assistant" and stored.status == "complete"
    assert stored.text == PIECE * (reply // len(PIECE))
    assert grown < BOUND * reply, \
        f"serve's peak RSS grew by {grown / 1e6:.0f} MB for a {REPLY_MB} MB reply " \
        f"({grown / reply:.1f} times; at most {BOUND:g})"
