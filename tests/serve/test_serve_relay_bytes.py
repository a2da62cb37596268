"""``serve`` writes each upstream event to the client as the upstream sent it, byte for
byte (it parses each event once, to store it, and encodes nothing again), however the
upstream's reads cut the events; and it still stores each piece before relaying it.

Over real HTTP: an upstream that sends fixed bytes (``support.raw_upstream``), the
proxy as a subprocess on a real store. The splitter the relay reads events with
(``chatstate.serve._sse``) is checked on its own against every way of cutting a body.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import httpx2
import pytest
from support.raw_upstream import RawUpstream
from support.serve_helpers import ServeProcess, local_url, serve_env
from support.stores import load_once

from chatstate.serve._sse import Event, EventSplitter

# What an upstream may send that a proxy re-encoding its events would not give back:
# an ``id:`` line, ``data:`` with no space, spacing and escapes inside the JSON, a
# comment line inside an event. The comment-only event that opens it carries nothing.
EVENTS = [
    b'id: 1\ndata:{"id":"c1","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
    b'data: {"id": "c1", "model": "m",  "choices": [ {"index": 0, "delta": '
    b'{"content": "h\\u00e9llo"}} ]}\n\n',
    b': a comment inside an event\ndata: {"id":"c1","model":"m","choices":[{"index":0,'
    b'"delta":{"content":" world"}}]}\n\n',
    b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{},'
    b'"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]
BODY = b": keep-alive\n\n" + b"".join(EVENTS)


def _cut(body: bytes, at: list[int]) -> list[bytes]:
    edges = [0, *at, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(edges) if b > a]


# reads that end mid-line, between the two newlines of a blank line, and mid-JSON
CUTS = [BODY.index(b"data:{") + 3, BODY.index(b"\n\n", 40) + 1, BODY.index(b"u00e9"),
        BODY.index(b"[DONE]") - 2]


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_serve_relays_the_upstreams_event_bytes_unchanged(tmp_path: Path, kind: str) -> None:
    with RawUpstream(_cut(BODY, CUTS)) as upstream, \
            ServeProcess(local_url(kind, tmp_path), upstream.base_url,
                         serve_env(tmp_path)) as proxy:
        with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=30,
                           json={"model": "m", "stream": True,
                                 "messages": [{"role": "user", "content": "hi"}]}) as resp:
            assert resp.status_code == 200
            got = resp.read()
            cid = resp.headers["x-chatstate-conversation"]
        proxy.stop()
    assert got == b"".join(EVENTS)
    assert json.loads(upstream.bodies[0])["messages"] == [{"role": "user", "content": "hi"}]
    reply = load_once(local_url(kind, tmp_path), cid).messages[-1]
    assert (reply.role, reply.text, reply.status) == ("assistant", "héllo world", "complete")


def _split(reads: list[bytes]) -> list[Event]:
    splitter = EventSplitter()
    events = [e for read in reads for e in splitter.feed(read)]
    return events + splitter.end()


def test_the_splitter_gives_the_same_events_however_the_reads_cut_the_body() -> None:
    whole = _split([BODY])
    assert [e.raw for e in whole] == EVENTS
    assert whole[1].data.startswith(b'{"id": "c1"') and whole[0].name is None
    for at in range(1, len(BODY)):
        assert _split(_cut(BODY, [at])) == whole, at
    assert _split([bytes([b]) for b in BODY]) == whole


def test_the_splitter_reads_every_line_end_names_and_a_last_event_left_open() -> None:
    body = (b"\xef\xbb\xbfevent: one\r\ndata: a\r\ndata: b\r\n\r\n"
            b"event: two\rdata: c\r\rdata: open")
    want = [Event("one", b"a\nb", b"event: one\ndata: a\ndata: b\n\n"),
            Event("two", b"c", b"event: two\ndata: c\n\n"),
            Event(None, b"open", b"data: open\n\n")]
    assert _split([body]) == want
    for at in range(1, len(body)):
        assert _split(_cut(body, [at])) == want, at
