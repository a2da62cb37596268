"""``chatstate serve``: headers both ways, the record of each request, paced partial saves.

A real proxy process in front of the fake model (whose request log shows what
reached it); the store is read back after each request.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.cli_helpers import CHATSTATE
from support.serve_helpers import ServeProcess, local_url, serve_env

from chatstate.core.transcript import Conversation, new_turn_id
from chatstate.serve._relay import StreamRelay
from chatstate.session.turn_writer import TurnWriter
from chatstate.stores import open_store
from chatstate.testing import FakeModel

CANARY = "sk-canary-records-0123456789abcdef"
TOKEN = "token-records-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMITS = {"x-ratelimit-remaining-requests": "99", "x-ratelimit-reset-tokens": "6ms",
          "Retry-After": "3", "anthropic-ratelimit-requests-remaining": "98",
          "anthropic-organization-id": "org-1", "openai-processing-ms": "12"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SCHEMA = {"type": "json_schema", "json_schema": {
    "name": "answer", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as f:
        yield f


@pytest.fixture(autouse=True)
def clean_fake(fake: FakeModel) -> Iterator[None]:
    fake.reset()
    fake.configure(reply_headers={})
    yield
    fake.configure(reply_headers={})


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, fake: FakeModel) -> Iterator[ServeProcess]:
    base = tmp_path_factory.mktemp("serve-records")
    url = local_url("sqlite", base)
    env = serve_env(base, OPENAI_API_KEY=CANARY)
    with ServeProcess(url, fake.base_url, env, "--token", TOKEN) as p:
        p.store_url = url  # type: ignore[attr-defined]
        p.env = env  # type: ignore[attr-defined]
        yield p


def load(p: ServeProcess, cid: str) -> Conversation:
    store = open_store(p.store_url)  # type: ignore[attr-defined]
    try:
        conv: Conversation = store.load(cid)
        return conv
    finally:
        store.close()


def chat(p: ServeProcess, body: dict[str, Any], **headers: str) -> httpx2.Response:
    return httpx2.post(p.base_url + "/chat/completions", json=body,
                       headers={**AUTH, **headers}, timeout=30)


def streamed(p: ServeProcess, body: dict[str, Any], **headers: str
             ) -> tuple[httpx2.Headers, str]:
    with httpx2.stream("POST", p.base_url + "/chat/completions", json={**body, "stream": True},
                       headers={**AUTH, **headers}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        return r.headers, r.read().decode()


def ask(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": text}], **fields}


# -- item 16: headers both ways ---------------------------------------------------------------

def test_streamed_and_plain_responses_carry_the_upstreams_headers(proxy: ServeProcess,
                                                                  fake: FakeModel) -> None:
    fake.configure(reply_headers=LIMITS)
    headers, text = streamed(proxy, ask("headers on a stream"))
    assert "[DONE]" in text
    sent = fake.request_log[-1]["request_id"]
    assert sent and headers["x-request-id"] == sent
    assert headers["x-ratelimit-remaining-requests"] == "99"
    assert headers["x-ratelimit-reset-tokens"] == "6ms"
    assert headers["retry-after"] == "3"
    # Anthropic's own (a stream relayed only the OpenAI names)
    assert headers["anthropic-ratelimit-requests-remaining"] == "98"
    assert headers["anthropic-organization-id"] == "org-1"
    assert headers["openai-processing-ms"] == "12"
    assert headers["x-chatstate-conversation"]

    plain = chat(proxy, ask("headers on a plain reply"))
    assert plain.status_code == 200
    assert plain.headers["x-request-id"] == fake.request_log[-1]["request_id"]
    assert plain.headers["x-ratelimit-remaining-requests"] == "99"


def test_openai_headers_go_upstream_and_the_token_does_not(proxy: ServeProcess,
                                                           fake: FakeModel) -> None:
    sent = {"OpenAI-Organization": "org-records", "OpenAI-Project": "proj_records",
            "OpenAI-Beta": "assistants=v2", "Idempotency-Key": "idem-records-1",
            "X-Other": "not forwarded"}
    assert chat(proxy, ask("forward my headers"), **sent).status_code == 200
    streamed(proxy, ask("forward them on a stream too"),
             **{**sent, "Idempotency-Key": "idem-records-2"})
    plain, stream = fake.request_log[-2:]
    for entry, key in ((plain, "idem-records-1"), (stream, "idem-records-2")):
        got = entry["headers"]
        assert got["openai-organization"] == "org-records"
        assert got["openai-project"] == "proj_records"
        assert got["openai-beta"] == "assistants=v2"
        assert got["idempotency-key"] == key
        assert "x-other" not in got
        assert "authorization" not in got  # the fake logs presence only ...
        assert entry["authorization"]  # ... of the proxy's upstream key, not the token
    logged = json.dumps(fake.request_log) + proxy.stderr
    assert TOKEN not in logged and CANARY not in logged


# -- item 18: the record of each request ------------------------------------------------------

def replay_requests(p: ServeProcess, cid: str, fmt: str = "json") -> str:
    out = subprocess.run([CHATSTATE, "--store", p.store_url,  # type: ignore[attr-defined]
                          "replay", cid, "--requests", "--format", fmt],
                         env=p.env, capture_output=True, text=True,  # type: ignore[attr-defined]
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_each_request_is_recorded_beside_its_messages(proxy: ServeProcess,
                                                      fake: FakeModel) -> None:
    body = ask("record this request", temperature=0.25, max_tokens=50, tools=TOOLS,
               tool_choice="auto", response_format=SCHEMA, logprobs=True, top_logprobs=2,
               seed=7)
    r = chat(proxy, body)
    assert r.status_code == 200
    cid = r.headers["x-chatstate-conversation"]
    upstream_id = fake.request_log[-1]["request_id"]
    conv = load(proxy, cid)
    user, reply = conv.messages[-2:]
    record = (user.params or {})["request"]
    assert record["model"] == "fake-model"
    assert isinstance(record["key"], str)  # the idempotency key, in the same one place
    options = record["options"]
    assert options["temperature"] == 0.25 and options["max_tokens"] == 50
    assert options["tools"] == TOOLS and options["tool_choice"] == "auto"
    assert options["response_format"] == SCHEMA
    assert options["logprobs"] is True and options["top_logprobs"] == 2
    response = (reply.params or {})["response"]
    assert response["status"] == 200 and response["upstream_request_id"] == upstream_id
    assert isinstance(response["duration_ms"], int) and response["duration_ms"] >= 0

    # a streamed turn of the same conversation, then one the upstream refuses
    streamed(proxy, {**body, "messages": [*body["messages"],
                                          {"role": "assistant", "content": reply.text},
                                          {"role": "user", "content": "and streamed"}]},
             **{"X-Chatstate-Conversation": cid})
    stream_id = fake.request_log[-1]["request_id"]
    fake.fail_next(503)
    history = [{"role": m.role, "content": m.text} for m in load(proxy, cid).messages]
    failed = chat(proxy, {"model": "fake-model", "temperature": 0.5, "messages": [
        *history, {"role": "user", "content": "this one fails"}]},
        **{"X-Chatstate-Conversation": cid})
    assert failed.status_code == 503, (failed.text, proxy.stderr[-3000:])
    failed_id = fake.request_log[-1]["request_id"]

    rows = json.loads(replay_requests(proxy, cid))
    assert [row.get("upstream_request_id") for row in rows] == [upstream_id, stream_id,
                                                                failed_id]
    assert [row.get("status") for row in rows] == [200, 200, 503]
    assert rows[0]["options"]["tools"] == TOOLS and rows[1]["options"]["stream"] is True
    assert rows[0]["reply"]["status"] == "complete" and "reply" not in rows[2]
    assert "503" in json.dumps(rows[2]["error"]) or rows[2]["error"]
    text = replay_requests(proxy, cid, "text")
    assert "tools=[get_weather]" in text and "response_format=json_schema(answer)" in text
    assert f"upstream id {upstream_id}" in text and "HTTP 503" in text

    api = httpx2.get(proxy.base_url + f"/chatstate/conversations/{cid}",
                     params={"requests": "true"}, headers=AUTH, timeout=30)
    assert api.status_code == 200
    assert api.json()["data"] == rows


def test_the_record_keeps_replays_idempotent(proxy: ServeProcess, fake: FakeModel) -> None:
    body = ask("the same request twice", temperature=0.1)
    first = chat(proxy, body, **{"Idempotency-Key": "records-twice"})
    again = chat(proxy, body, **{"Idempotency-Key": "records-twice"})
    assert again.headers.get("x-chatstate-replayed") == "true"
    assert again.headers["x-chatstate-conversation"] == first.headers["x-chatstate-conversation"]
    assert len([e for e in fake.request_log if e["path"] == "/v1/chat/completions"]) == 1


# -- item 7: partial saves are paced -----------------------------------------------------------

def test_partial_saves_of_a_fast_long_stream_are_paced(tmp_path: Path) -> None:
    """A stream of many small events that arrive faster than the reply so far can be
    rewritten: the partial saves (each writes the whole reply so far) stay few, and
    what they write stays in proportion to the reply."""
    store = open_store(f"sqlite://{tmp_path}/paced.db")
    writer = TurnWriter(store, Conversation(id="paced", title="paced"), created=False)
    writer.create()
    turn_id = new_turn_id()
    written: list[int] = []
    events, piece = 3000, "x" * 2000

    def save(text: str, model: str | None) -> None:
        written.append(len(text))
        writer.save_partial(turn_id, text, model)

    async def lines() -> AsyncIterator[str]:
        for i in range(events):
            if i % 4 == 0:
                await asyncio.sleep(0.001)  # a fast upstream: 4 events a millisecond
            yield "data: " + json.dumps({"model": "m", "choices": [
                {"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
            yield ""
        yield 'data: {"model": "m", "choices": [{"index": 0, "delta": {}, ' \
              '"finish_reason": "stop"}]}'
        yield ""
        yield "data: [DONE]"
        yield ""

    relay = StreamRelay(lines(), save_partial=save,
                        commit=lambda reply: writer.reply(turn_id, **reply),
                        fail=lambda detail: None)

    async def run() -> int:
        got = 0
        async for chunk in relay.events():
            got += len(chunk)
        return got

    started = time.perf_counter()
    asyncio.run(run())
    took = time.perf_counter() - started
    store.close()
    total = events * len(piece)
    assert relay.committed
    assert sum(written) <= 4 * total, (len(written), sum(written), took)
    assert len(written) <= 25, (len(written), sum(written), took)
