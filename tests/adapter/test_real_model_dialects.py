"""The Responses and Anthropic Messages dialects against llama.cpp's own server (the
real-model tier, a server nobody here wrote): through ``Chat`` and through ``serve``,
plain and streamed, each reply cut at a max tokens the request asks for (see CUT_STORED
for what llama.cpp reports of it), and a kill -9 of the server mid-stream followed by a
retry.

The server and its cached venv are test_real_model's (same module directory).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.cli_helpers import CHATSTATE, run_cli
from support.serve_helpers import ServeProcess, serve_env
from test_real_model import N_PREDICT, LlamaServer, env_for, venv_python

from chatstate.adapter import make_adapter
from chatstate.session.chat import Chat
from chatstate.stores import open_store

__all__ = ["venv_python"]  # the cached venv fixture, shared with test_real_model

pytestmark = pytest.mark.slow
DIALECTS = ["responses", "anthropic_messages"]
CUT = 3  # max tokens asked for: every reply is cut there
# What the store keeps for a reply cut at CUT tokens: "length" for both. llama.cpp
# (xllamacpp 2026.10.11549) says Anthropic ``stop_reason: max_tokens``, but reports a
# Responses reply cut at ``max_output_tokens`` as ``status: completed``: the responses
# dialect reads output tokens at the requested limit as the cut it was (``settle``).
CUT_STORED = {"responses": "length", "anthropic_messages": "length"}


@pytest.fixture(scope="module")
def llama(venv_python: Path, tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[LlamaServer]:
    server = LlamaServer(venv_python, tmp_path_factory.mktemp("llama") / "server.log").start()
    try:
        yield server
    finally:
        server.kill()


def load(url: str, cid: str) -> Any:
    store = open_store(url)
    try:
        return store.load(cid)
    finally:
        store.close()


def verified(url: str, cid: str, tmp_path: Path) -> None:
    """``chatstate replay ID --verify`` from a fresh process says the chain holds."""
    done = run_cli(["replay", cid, "--verify"], env_for(tmp_path, "http://127.0.0.1:9/v1"),
                   store=url, timeout=120)
    assert done.code == 0, done.err


@pytest.mark.parametrize("api", DIALECTS)
def test_chat_plain_and_streamed_each_cut_at_the_servers_limit(
        tmp_path: Path, llama: LlamaServer, api: str) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    adapter = make_adapter(base_url=llama.url, api=api, model="smollm2", api_key="k",
                           timeout=120)
    chat = Chat(url, conversation_id="c", adapter=adapter)
    try:
        # asks that take more than CUT tokens, sampled greedily: "Say bye." was once
        # answered whole within 3 tokens under CI's load (a finished reply, not a cut one)
        plain = chat.send("Count from one to twenty in words.", max_tokens=CUT,
                          temperature=0)
        streamed = "".join(chat.stream("Count from one to twenty in words, please.",
                                       max_tokens=CUT, temperature=0))
    finally:
        chat.store.close()
    conv = load(url, "c")
    assert [m.role for m in conv.messages] == ["user", "assistant"] * 2
    assert conv.messages[1].text == plain.text and plain.text
    assert conv.messages[3].text == streamed and streamed
    assert [m.finish_reason for m in conv.messages[1::2]] == [CUT_STORED[api]] * 2, \
        [(m.text, m.usage) for m in conv.messages[1::2]]
    assert conv.verify() is None
    verified(url, "c", tmp_path)


def _serve_body(api: str, text: str, stream: bool) -> tuple[str, dict[str, Any]]:
    if api == "responses":
        return "/responses", {"model": "smollm2", "input": text, "stream": stream,
                              "max_output_tokens": CUT}
    return "/messages", {"model": "smollm2", "max_tokens": CUT, "stream": stream,
                         "messages": [{"role": "user", "content": text}]}


def _streamed(resp: Any) -> tuple[str, list[dict[str, Any]]]:
    text, events = "", []
    for line in resp.iter_lines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            events.append(event)
            if event.get("type") == "response.output_text.delta":
                text += event["delta"]
            elif event.get("type") == "content_block_delta" and \
                    event["delta"].get("type") == "text_delta":
                text += event["delta"]["text"]
    return text, events


@pytest.mark.parametrize("api", DIALECTS)
def test_serve_plain_and_streamed_each_cut_and_stored(tmp_path: Path, llama: LlamaServer,
                                                      api: str) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    with ServeProcess(url, llama.url, serve_env(tmp_path)) as proxy:
        path, body = _serve_body(api, "Say hello.", False)
        plain = httpx2.post(proxy.base_url + path, json=body, timeout=120,
                            headers={"X-Chatstate-Conversation": "p"})
        assert plain.status_code == 200, plain.text
        doc = plain.json()
        path, body = _serve_body(api, "Say bye.", True)
        with httpx2.stream("POST", proxy.base_url + path, json=body, timeout=120,
                           headers={"X-Chatstate-Conversation": "s"}) as resp:
            assert resp.status_code == 200
            streamed, events = _streamed(resp)
    if api == "responses":
        said = "".join(c["text"] for item in doc["output"] if item["type"] == "message"
                       for c in item["content"])
        assert doc["usage"]["output_tokens"] <= CUT
        last = events[-1]
        assert last["type"] in ("response.incomplete", "response.completed"), last
        assert all("output_index" in e for e in events if e["type"].startswith(
            ("response.output_item", "response.output_text", "response.content_part")))
    else:
        said = "".join(b["text"] for b in doc["content"] if b["type"] == "text")
        assert doc["stop_reason"] == "max_tokens"
        stops = [e for e in events if e.get("type") == "message_delta"]
        assert stops and stops[-1]["delta"]["stop_reason"] == "max_tokens"
    for cid, text in (("p", said), ("s", streamed)):
        conv = load(url, cid)
        assert text and conv.messages[-1].text == text
        assert conv.messages[-1].finish_reason == CUT_STORED[api]
        verified(url, cid, tmp_path)


@pytest.mark.parametrize("api", DIALECTS)
def test_kill_9_of_llama_mid_stream_then_retry(tmp_path: Path, venv_python: Path,
                                               api: str) -> None:
    log = tmp_path / "server.log"
    server = LlamaServer(venv_python, log, n_predict=256).start()  # still talking when killed
    store = f"sqlite://{tmp_path}/s.db"
    env = env_for(tmp_path, server.url, CHATSTATE_MAX_RETRIES="1", CHATSTATE_API=api)
    try:
        # a request's max tokens overrides llama.cpp's n_predict, and the Anthropic dialect
        # must send one: keep the retry's reply short (stored with the turn, so reused)
        ask = subprocess.Popen([CHATSTATE, "--store", store, "ask", "--id", "k",
                                "--max-tokens", "48", "Tell me a long story about the sea."],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert ask.stdout is not None
        first = ask.stdout.read(1)  # a delta is on screen, so it is stored
        assert first, ask.stderr.read() if ask.stderr else ""
        server.kill()
        _, err = ask.communicate(timeout=300)
        assert ask.returncode == 1, err
        assert b"--retry" in err
        conv = load(store, "k")
        assert conv.partial is not None and conv.partial.content
        kept = conv.partial.text
        again = LlamaServer(venv_python, log, n_predict=N_PREDICT,
                            port=int(server.url.rsplit(":", 1)[1].split("/")[0])).start()
        try:
            done = run_cli(["ask", "--id", "k", "--retry"], env, store=store, timeout=300)
        finally:
            again.kill()
        assert done.code == 0, done.err
        conv = load(store, "k")
        # the cut reply stays in the record, marked partial; the retry answers the same turn
        assert [(m.role, m.status) for m in conv.messages] == [
            ("user", "complete"), ("assistant", "partial"), ("assistant", "complete")]
        assert kept and conv.messages[1].text == kept and conv.messages[-1].text
        assert conv.partial is None
        verified(store, "k", tmp_path)
    finally:
        server.kill()


@pytest.mark.parametrize("api", DIALECTS)
def test_serve_kill_9_of_llama_mid_stream_then_the_client_retries(
        tmp_path: Path, venv_python: Path, api: str) -> None:
    """The upstream dies mid-stream under serve: what the client received is stored, the
    stream ends without the API's end event, and the client's resend answers the same
    turn (one user message)."""
    log = tmp_path / "server.log"
    server = LlamaServer(venv_python, log, n_predict=256).start()
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    url = f"sqlite://{tmp_path}/s.db"
    path, body = _serve_body(api, "Tell me a long story about the sea.", True)
    body["max_output_tokens" if api == "responses" else "max_tokens"] = 48
    headers = {"X-Chatstate-Conversation": "k"}
    try:
        with ServeProcess(url, server.url, serve_env(tmp_path, CHATSTATE_MAX_RETRIES="0")
                          ) as proxy:
            received, events = "", []
            with httpx2.stream("POST", proxy.base_url + path, json=body, timeout=120,
                               headers=headers) as resp:
                assert resp.status_code == 200
                lines = resp.iter_lines()
                for line in lines:
                    piece, seen = _streamed_line(line)
                    events += seen
                    received += piece
                    if piece:
                        server.kill()  # a piece is on the client's side, so it is stored
                        break
                for line in lines:
                    piece, seen = _streamed_line(line)
                    events += seen
                    received += piece
            kinds = [e.get("type") for e in events]
            # the client can tell the reply is cut: the API's end event never came
            assert not {"response.completed", "message_stop"} & set(kinds), kinds
            conv = load(url, "k")
            cut = conv.partial or conv.messages[-1]
            assert received and cut.role == "assistant" and cut.text.startswith(received)
            again = LlamaServer(venv_python, log, n_predict=N_PREDICT, port=port).start()
            try:
                with httpx2.stream("POST", proxy.base_url + path, json=body, timeout=120,
                                   headers=headers) as resp:
                    assert resp.status_code == 200
                    answer, _ = _streamed(resp)
            finally:
                again.kill()
    finally:
        server.kill()
    conv = load(url, "k")
    assert [m.role for m in conv.messages if m.status != "partial"] == ["user", "assistant"]
    assert answer and conv.messages[-1].text == answer
    verified(url, "k", tmp_path)


def _streamed_line(line: str) -> tuple[str, list[dict[str, Any]]]:
    if not line.startswith("data: {"):
        return "", []
    event = json.loads(line[6:])
    if event.get("type") == "response.output_text.delta":
        return str(event["delta"]), [event]
    if event.get("type") == "content_block_delta" and event["delta"].get("type") == \
            "text_delta":
        return str(event["delta"]["text"]), [event]
    return "", [event]


def test_previous_response_id_through_serve_in_front_of_llama(tmp_path: Path,
                                                              llama: LlamaServer) -> None:
    """llama.cpp refuses ``previous_response_id`` (400); through serve it is answered from
    the store, the second turn continuing the first's conversation."""
    direct = httpx2.post(llama.url + "/responses", timeout=120, json={
        "model": "smollm2", "input": "hi", "previous_response_id": "resp_x"})
    assert direct.status_code == 400  # what the recipe says llama.cpp does
    url = f"sqlite://{tmp_path}/s.db"
    with ServeProcess(url, llama.url, serve_env(tmp_path)) as proxy:
        first = httpx2.post(proxy.base_url + "/responses", timeout=120, json={
            "model": "smollm2", "input": "My name is Ana.", "max_output_tokens": CUT})
        assert first.status_code == 200, first.text
        second = httpx2.post(proxy.base_url + "/responses", timeout=120, json={
            "model": "smollm2", "input": "What is my name?", "max_output_tokens": CUT,
            "previous_response_id": first.json()["id"], "stream": False})
        assert second.status_code == 200, second.text
    store = open_store(url)
    try:
        (summary,) = store.list_conversations()
        conv = store.load(summary.id)
    finally:
        store.close()
    assert [m.text for m in conv.messages if m.role == "user"] == ["My name is Ana.",
                                                                   "What is my name?"]
    assert [m.role for m in conv.messages] == ["user", "assistant"] * 2
    verified(url, summary.id, tmp_path)
