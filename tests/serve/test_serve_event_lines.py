"""``chatstate serve`` splits an upstream's event stream where the SSE spec does.

An event stream's lines end at CRLF, LF or CR, and nowhere else. ``str.splitlines``
(and httpx2's ``aiter_lines``, which follows it) also breaks at U+2028, U+2029, U+0085
and a few control characters; a server that writes its JSON as UTF-8 (llama.cpp's,
vLLM) sends U+2028, U+2029 and U+0085 raw inside an event's data, so a proxy that
split there cut the event in two: the stored reply lost the text after the character,
and the client got a broken event. Here the fake writes raw UTF-8 (``ascii_json``),
the reply echoes a user message holding each of them, and the client (the openai SDK)
and the store must both have the reply exactly as the upstream sent it, on each of
the three wire APIs and with the stream's lines ended by LF, CRLF or CR.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
from support.serve_helpers import ServeProcess, serve_env

from chatstate.serve._relay import sse_data
from chatstate.serve._stream_check import sse_lines
from chatstate.stores import open_store
from chatstate.testing import FakeModel

ID = "X-Chatstate-Conversation"
ODD = "a\u2028b\u2029c\x85d\u00e9\u6f22\U0001f98a e"  # line breaks to splitlines, not to SSE


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeModel,
                                                                      ServeProcess, str]]:
    base = tmp_path_factory.mktemp("event-lines")
    url = f"json://{base}/store"
    with FakeModel(reply_words=6) as fake, \
            ServeProcess(url, fake.base_url, serve_env(base)) as proxy:
        fake.configure(ascii_json=False)
        yield fake, proxy, url


def stored_reply(url: str, cid: str) -> str:
    store = open_store(url)
    try:
        conv = store.load(cid)
    finally:
        store.close()
    assert conv.verify() is None
    assert conv.messages[-1].role == "assistant" and conv.messages[-1].status == "complete"
    return conv.messages[-1].text


def test_the_upstream_really_sends_them_raw(served: tuple[FakeModel, ServeProcess, str]
                                           ) -> None:
    """The premise: the fake's stream holds the characters unescaped (so the tests below
    can fail), and splitlines would cut its events there."""
    fake, _, _ = served
    with httpx2.stream("POST", fake.base_url + "/chat/completions", timeout=30, json={
            "model": "m", "stream": True,
            "messages": [{"role": "user", "content": ODD}]}) as resp:
        raw = resp.read().decode()
    assert "\u2028" in raw and "\x85" in raw
    assert len(raw.splitlines()) > len(raw.split("\n"))
    # and a client reads it whole straight from the upstream
    direct = openai.OpenAI(base_url=fake.base_url, api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": ODD}]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in
                   direct.chat.completions.create(model="m", messages=messages, stream=True)
                   if chunk.choices)
    assert text == fake.reply_for(messages)


def test_a_chat_stream_with_them_reaches_the_client_and_the_store_whole(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    fake, proxy, url = served
    messages: list[Any] = [{"role": "user", "content": ODD}]
    client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0)
    stream = client.chat.completions.with_raw_response.create(
        model="m", messages=messages, stream=True, extra_headers={ID: "odd-chat"})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream.parse()
                   if chunk.choices)
    expected = fake.reply_for(messages)
    assert ODD in expected
    assert text == expected
    assert stored_reply(url, "odd-chat") == expected


def test_a_responses_stream_with_them_reaches_the_client_and_the_store_whole(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    fake, proxy, url = served
    client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0)
    deltas = []
    with client.responses.stream(model="m", input=ODD,
                                 extra_headers={ID: "odd-responses"}) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    expected = fake.reply_for([{"role": "user", "content": ODD}])
    assert "".join(deltas) == final.output_text == expected
    assert stored_reply(url, "odd-responses") == expected


def test_a_messages_stream_with_them_reaches_the_client_and_the_store_whole(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    fake, proxy, url = served
    texts = []
    with httpx2.stream("POST", proxy.base_url + "/messages", timeout=30,
                       headers={ID: "odd-messages", "anthropic-version": "2023-06-01"},
                       json={"model": "m", "max_tokens": 200, "stream": True,
                             "messages": [{"role": "user", "content": ODD}]}) as resp:
        assert resp.status_code == 200
        for event in httpx2.EventSource(resp):  # its lines split as the SSE spec says
            if event.event == "content_block_delta":
                delta = json.loads(event.data)["delta"]
                texts.append(delta.get("text", ""))
    expected = fake.reply_for([{"role": "user", "content": ODD}])
    assert "".join(texts) == expected
    assert stored_reply(url, "odd-messages") == expected


async def _chunks(pieces: list[bytes]) -> Any:
    for piece in pieces:
        yield piece


def _lines_of(pieces: list[bytes]) -> list[str]:
    async def lines() -> list[str]:
        return [line async for line in sse_lines(_chunks(pieces))]
    return asyncio.run(lines())


def _data_of(pieces: list[bytes]) -> list[str]:
    async def data() -> list[str]:
        return [d async for d in sse_data(sse_lines(_chunks(pieces)))]
    return asyncio.run(data())


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_lines_end_at_lf_crlf_or_cr_however_the_reads_cut_them(end: str) -> None:
    events = [json.dumps({"text": ODD}, ensure_ascii=False), "second", "[DONE]"]
    stream = "".join(f"data: {e}{end}{end}" for e in events).encode()
    # every way of cutting it into two reads (inside a CRLF, inside a UTF-8 sequence)
    for cut in range(len(stream) + 1):
        assert _data_of([stream[:cut], stream[cut:]]) == events, (end, cut)
    # one byte per read, and all in one
    assert _data_of([stream[i:i + 1] for i in range(len(stream))]) == events
    assert _data_of([stream]) == events


def test_a_last_line_without_its_end_is_still_a_line() -> None:
    assert _lines_of([b"data: x\r\ndata: y"]) == ["data: x", "data: y"]
    assert _lines_of([b"data: x\r"]) == ["data: x"]
    assert _lines_of([b"data: \xff\n"]) == ["data: \ufffd"]  # as httpx2 decodes it
    assert _lines_of([]) == []
