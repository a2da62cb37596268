"""``serve`` relays a long streamed reply in bounded memory, however slowly it is read.

A real ``chatstate serve`` process on sqlite and on json relays a 20 MB streamed reply
from a fast upstream (``support.big_stream``) to a client that reads the first bytes,
stops reading for a few seconds, then reads the rest. The serve process's peak RSS
(VmHWM, from a warmed-up start) may grow by at most 3 times the reply's size plus a
fixed allowance for the read-ahead (``READ_AHEAD``): its text once, and what writing
it costs (SQLite copies a row it inserts twice). It grew by 6 to 8 times the reply
before (issue 22, item 7): the reply text, its canonical JSON, SQLite's copies of the
bound value, the previous partial and the JSON encoder's copies. What the client got
and what is stored are the whole reply.

A bound on memory, not a timing.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx2
import pytest
from support.serve_helpers import ServeProcess, local_url, serve_env
from support.stores import load_once

from chatstate.testing.big_stream import big_stream_upstream

REPLY = 20 * 1000 * 1000
"""Characters of the streamed reply (``x``, so as many bytes of text)."""
READ_AHEAD = 48 * 1024 * 1024
"""The fixed allowance: the relay's read-ahead (at most 32 MiB of events), the
interpreter's own growth and SQLite's page cache and WAL index (sqlite measures 90-95 MiB
for the 19 MiB reply, json 60-77 MiB; main before the body pieces: 172 and 180 MiB)."""
STALL = 2.0


def status(pid: int, field: str) -> int:
    """``field`` (VmRSS, VmHWM) of process ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current RSS (``clear_refs`` 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def stalled_read(base_url: str, ask: str, stall: float) -> tuple[bytes, str]:
    """(the response body, its conversation id) of one streamed request whose reader
    stops for ``stall`` seconds after the first bytes (a small receive buffer, so the
    kernel does not read ahead for it)."""
    host, port = base_url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
    body = json.dumps({"model": "big", "stream": True,
                       "messages": [{"role": "user", "content": ask}]}).encode()
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
    raw = b"".join(got)
    head, _, rest = raw.partition(b"\r\n\r\n")
    cid = next(line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
               if line.lower().startswith(b"x-chatstate-conversation:"))
    return rest, cid


def dechunked(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body, its chunks joined."""
    out, at = [], 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[end + 2:end + 2 + size])
        at = end + 2 + size + 2


def relayed_text(body: bytes) -> str:
    """The content deltas of a (chunked) chat-completions event stream, joined."""
    text = []
    for line in dechunked(body).split(b"\n"):
        if line.startswith(b"data: {"):
            choices = json.loads(line[6:])["choices"]
            text.append((choices[0]["delta"].get("content") or "") if choices else "")
    return "".join(text)


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_a_long_reply_read_slowly_costs_at_most_three_times_its_size(
        tmp_path: Path, kind: str) -> None:
    url = local_url(kind, tmp_path)
    with big_stream_upstream(REPLY) as upstream, \
            ServeProcess(url, upstream, serve_env(tmp_path)) as proxy:
        warm = httpx2.post(proxy.base_url + "/chat/completions", timeout=60, json={
            "model": "big", "stream": True, "messages": [{"role": "user", "content": "small"}]})
        assert warm.status_code == 200, warm.text
        pid = proxy.proc.pid
        reset_peak(pid)
        start = status(pid, "VmRSS")
        body, cid = stalled_read(proxy.base_url, "a long one", STALL)
        grown = status(pid, "VmHWM") - start
    assert relayed_text(body) == "x" * REPLY  # the client got the whole reply
    conv = load_once(url, cid)
    assert conv.messages[-1].content == "x" * REPLY and conv.messages[-1].status == "complete"
    assert conv.partial is None
    bound = 3 * REPLY + READ_AHEAD
    print(f"{kind}: peak RSS growth {grown / 2**20:.0f} MiB for a {REPLY / 2**20:.0f} MiB reply "
          f"(bound {bound / 2**20:.0f} MiB)")
    assert grown <= bound, (
        f"{kind}: relaying a {REPLY / 1e6:.0f} MB reply to a stalled reader grew serve's "
        f"peak RSS by {grown / 2**20:.0f} MiB, more than 3x the reply + "
        f"{READ_AHEAD / 2**20:.0f} MiB = {bound / 2**20:.0f} MiB")
