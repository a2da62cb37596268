"""``chatstate serve``: failures look like failures, to the client and in the store.

An upstream that cuts its stream, fails in-band, answers a streamed request with an
HTML page or a plain request with garbage; a client that leaves mid-stream; a body
the proxy cannot take (NaN, ``n>1``, deep nesting); a route it does not have. Each
reaches the client as an OpenAI-shaped error (so the openai SDK raises) and is
recorded in the conversation, never stored as a complete reply. And the OpenAI
routes chatstate does not persist pass through untouched (and are logged).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from support.serve_helpers import ServeProcess, local_url, serve_env

from chatstate.core.transcript import Conversation
from chatstate.errors import ConversationNotFound
from chatstate.stores import open_store
from chatstate.testing import FakeModel

ID = "X-Chatstate-Conversation"
CANARY = "sk-canary-failures-0123456789abcdef"
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=8) as f:
        yield f


@pytest.fixture(autouse=True)
def clean_fake(fake: FakeModel) -> Iterator[None]:
    fake.reset()
    fake.configure(chunk_delay=0.0, latency=0.0, reply_words=8)
    yield


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, fake: FakeModel) -> Iterator[ServeProcess]:
    base = tmp_path_factory.mktemp("serve-failures")
    url = local_url("json", base)
    with ServeProcess(url, fake.base_url, serve_env(base, OPENAI_API_KEY=CANARY),
                      global_args=("--log-format", "json")) as p:
        p.store_url = url  # type: ignore[attr-defined]
        yield p


def load(proxy: ServeProcess, cid: str) -> Conversation:
    store = open_store(proxy.store_url)  # type: ignore[attr-defined]
    try:
        conv: Conversation = store.load(cid)
        return conv
    finally:
        store.close()


def stored_ids(proxy: ServeProcess) -> set[str]:
    store = open_store(proxy.store_url)  # type: ignore[attr-defined]
    try:
        return {s.id for s in store.list_conversations()}
    finally:
        store.close()


def sdk(proxy: ServeProcess, cid: str | None = None) -> openai.OpenAI:
    headers = {ID: cid} if cid else None
    return openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0,
                         default_headers=headers, timeout=30)


def assert_openai_error(resp: httpx2.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json"), resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert set(error) >= ERROR_KEYS, error
    assert isinstance(error["message"], str) and error["message"]
    return error


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def no_complete_reply(conv: Conversation) -> None:
    assert [m.role for m in conv.messages] == ["user"], conv.messages
    assert not any(m.role == "assistant" and m.status == "complete" for m in conv.messages)


def read_stream(stream: Any) -> str:
    text = ""
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    return text


# -- item 10: an upstream cut mid-stream ---
@pytest.mark.invariant(2)
@pytest.mark.parametrize("clean", [False, True], ids=["connection-drop", "clean-end"])
def test_an_upstream_cut_mid_stream_raises_in_the_openai_sdk_and_stays_partial(
        proxy: ServeProcess, fake: FakeModel, clean: bool) -> None:
    """An upstream stream cut mid-way ends the client's stream in an error its SDK raises,
    and the chunks it got are the stored partial reply, with the failure recorded."""
    cid = f"cut-{'clean' if clean else 'drop'}"
    fake.cut_stream_next(after_chunks=3, clean=clean)
    got: list[str] = []
    with pytest.raises(openai.APIError) as raised:
        stream = sdk(proxy, cid).chat.completions.create(
            model="m", messages=user("cut me off"), stream=True)  # type: ignore[arg-type]
        for chunk in stream:
            if chunk.choices:
                got.append(chunk.choices[0].delta.content or "")
    assert "upstream" in str(raised.value)
    assert "".join(got)  # the client got the first chunks, then the failure
    conv = load(proxy, cid)
    no_complete_reply(conv)
    assert conv.partial is not None and conv.partial.status == "partial"
    assert conv.partial.text == "".join(got)  # what the client got is what is stored
    failure = conv.metadata["last_upstream_error"]
    assert failure["status"] == 502 and failure["turn_id"] == conv.messages[-1].turn_id
    assert "stream" in failure["detail"]


# -- item 11: n > 1 ---
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_n_over_one_is_refused_before_anything_is_stored_or_sent(
        proxy: ServeProcess, fake: FakeModel, stream: bool) -> None:
    cid = f"n2-{stream}"
    resp = httpx2.post(proxy.base_url + "/chat/completions", headers={ID: cid}, timeout=30,
                       json={"model": "m", "n": 2, "stream": stream,
                             "messages": user("two answers please")})
    error = assert_openai_error(resp, 400)
    assert error["param"] == "n" and "n=1" in error["message"]
    with pytest.raises(ConversationNotFound):
        load(proxy, cid)
    assert fake.request_log == []
    ok = httpx2.post(proxy.base_url + "/chat/completions", headers={ID: cid}, timeout=30,
                     json={"model": "m", "n": 1, "messages": user("one answer please")})
    assert ok.status_code == 200


# -- item 17: every failure recorded, every error OpenAI-shaped ---
def test_an_html_200_on_a_streamed_request_is_a_recorded_502(proxy: ServeProcess,
                                                              fake: FakeModel) -> None:
    fake.html_next()
    with httpx2.stream("POST", proxy.base_url + "/chat/completions", headers={ID: "html-s"},
                       json={"model": "m", "stream": True, "messages": user("portal")},
                       timeout=30) as resp:
        resp.read()
    error = assert_openai_error(resp, 502)
    assert resp.headers[ID] == "html-s"
    assert "text/html" in error["message"]
    conv = load(proxy, "html-s")
    no_complete_reply(conv)
    assert conv.metadata["last_upstream_error"]["status"] == 502
    assert "text/html" in conv.metadata["last_upstream_error"]["detail"]
    # the openai SDK raises, instead of returning an empty stream
    fake.html_next()
    with pytest.raises(openai.APIStatusError):
        read_stream(sdk(proxy).chat.completions.create(
            model="m", messages=user("portal again"), stream=True))  # type: ignore[arg-type]


@pytest.mark.parametrize("fault", ["html", "malformed"])
def test_an_unparseable_plain_reply_is_a_502_with_the_conversation_header(
        proxy: ServeProcess, fake: FakeModel, fault: str) -> None:
    getattr(fake, f"{fault}_next")()
    cid = f"garbage-{fault}"
    resp = httpx2.post(proxy.base_url + "/chat/completions", headers={ID: cid}, timeout=30,
                       json={"model": "m", "messages": user("garbage")})
    assert_openai_error(resp, 502)
    assert resp.headers[ID] == cid
    conv = load(proxy, cid)
    no_complete_reply(conv)
    assert conv.metadata["last_upstream_error"]["status"] == 502


def test_an_error_event_mid_stream_is_relayed_once_and_recorded(proxy: ServeProcess,
                                                                fake: FakeModel) -> None:
    fake.error_event_next(after_chunks=2, message="the model is overloaded (fake)")
    with pytest.raises(openai.APIError) as raised:
        read_stream(sdk(proxy, "in-band").chat.completions.create(
            model="m", messages=user("fail in band"), stream=True))  # type: ignore[arg-type]
    assert "overloaded" in str(raised.value)
    conv = load(proxy, "in-band")
    no_complete_reply(conv)
    assert conv.partial is not None and conv.partial.text
    assert "overloaded" in conv.metadata["last_upstream_error"]["detail"]
    # over raw HTTP: the upstream's error event, and no second one of the proxy's
    fake.error_event_next(after_chunks=2, message="the model is overloaded (fake)")
    with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=30, json={
            "model": "m", "stream": True, "messages": user("fail in band, raw")}) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    errors = [e for e in events if '"error"' in e]
    assert len(errors) == 1 and "overloaded" in errors[0]
    assert "[DONE]" not in events
    # an error event that echoes the upstream key is redacted, relayed and stored
    fake.error_event_next(after_chunks=1, message=f"bad key {CANARY} (fake)")
    with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=30,
                       headers={ID: "in-band-key"},
                       json={"model": "m", "stream": True, "messages": user("echo key")}) as resp:
        relayed = resp.read().decode()
    assert "bad key" in relayed and CANARY not in relayed
    detail = load(proxy, "in-band-key").metadata["last_upstream_error"]["detail"]
    assert "bad key" in detail and CANARY not in detail


def test_an_error_event_reaches_the_client_only_once_the_failure_is_recorded(
        proxy: ServeProcess, fake: FakeModel) -> None:
    # the upstream keeps its body open after the error event: a client whose SDK raises on
    # the event and leaves at once must find the failure recorded (it was a race, CI stop 35)
    fake.error_event_next(after_chunks=2, message="overloaded, lingering (fake)", linger=1.5)
    with pytest.raises(openai.APIError, match="lingering"):
        read_stream(sdk(proxy, "in-band-linger").chat.completions.create(
            model="m", messages=user("fail and linger"), stream=True))  # type: ignore[arg-type]
    conv = load(proxy, "in-band-linger")
    no_complete_reply(conv)
    assert conv.partial is not None and conv.partial.text
    assert "lingering" in conv.metadata["last_upstream_error"]["detail"]


def test_a_client_that_leaves_mid_stream_is_recorded_not_stored_complete(
        proxy: ServeProcess, fake: FakeModel) -> None:
    fake.configure(chunk_delay=0.1, reply_words=40)
    with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=30,
                       headers={ID: "left"},
                       json={"model": "m", "stream": True, "messages": user("I leave")}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {") and "Echo" in line:
                break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        conv = load(proxy, "left")
        if "last_upstream_error" in conv.metadata:
            break
        time.sleep(0.1)
    no_complete_reply(conv)
    assert conv.partial is not None
    failure = conv.metadata["last_upstream_error"]
    assert failure["status"] == 499 and "client" in failure["detail"]


def test_nan_and_deep_nesting_are_json_400s_and_store_nothing(proxy: ServeProcess,
                                                             fake: FakeModel) -> None:
    for cid, raw in [
            ("nan", '{"model":"m","temperature":NaN,"messages":[{"role":"user","content":"x"}]}'),
            ("inf", '{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":-Infinity}'),
            ("deep", '{"model":"m","messages":[{"role":"user","content":"x"}],"x":'
             + "[" * 5000 + "]" * 5000 + "}")]:
        resp = httpx2.post(proxy.base_url + "/chat/completions", content=raw.encode(),
                           headers={ID: cid, "Content-Type": "application/json"}, timeout=30)
        assert_openai_error(resp, 400)
        with pytest.raises(ConversationNotFound):
            load(proxy, cid)
    assert fake.request_log == []


def test_unknown_routes_and_methods_get_openai_shaped_errors(proxy: ServeProcess) -> None:
    for method, path in [("GET", "/v1/nope"), ("POST", "/v1/assistants"), ("GET", "/"),
                         ("POST", "/v1/models/fake-model"), ("GET", "/v1/embeddings")]:
        resp = httpx2.request(method, proxy.root + path, json={}, timeout=10)
        error = assert_openai_error(resp, 404 if "nope" in path or path in (
            "/", "/v1/assistants") else 405)
        assert path in error["message"]


def test_other_errors_are_openai_shaped(proxy: ServeProcess) -> None:
    resp = httpx2.post(proxy.base_url + "/chat/completions", json={"model": "m"}, timeout=10)
    assert_openai_error(resp, 400)
    resp = httpx2.post(proxy.base_url + "/chat/completions", headers={ID: "bad/id"},
                       json={"model": "m", "messages": user("x")}, timeout=10)
    assert_openai_error(resp, 400)


# -- pass-through ---
def access_paths(proxy: ServeProcess, path: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    hits: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not hits:
        entries = [json.loads(line) for line in proxy.lines if line.startswith("{")]
        hits = [e for e in entries if e.get("logger") == "chatstate.serve.access"
                and e.get("path") == path]
        time.sleep(0.05)
    return hits


def test_embeddings_completions_and_one_model_pass_through_unstored(
        proxy: ServeProcess, fake: FakeModel, tmp_path: Path) -> None:
    before = stored_ids(proxy)
    client = sdk(proxy)
    direct = openai.OpenAI(base_url=fake.base_url, api_key="unused", max_retries=0)
    emb = client.embeddings.create(model="m", input=["one", "two words"])
    assert emb.model_dump() == direct.embeddings.create(
        model="m", input=["one", "two words"]).model_dump()
    done = client.completions.create(model="m", prompt="say hi")
    assert done.choices[0].text == "Completed: say hi"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt="say hi", stream=True))
    assert streamed == "Completed: say hi"
    assert client.models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert "no-such-model" in str(missing.value)  # the upstream's own 404, relayed
    paths = [e["path"] for e in fake.request_log]
    assert paths == ["/v1/embeddings", "/v1/embeddings", "/v1/completions",
                     "/v1/completions", "/v1/models/fake-model", "/v1/models/no-such-model"]
    assert stored_ids(proxy) == before  # nothing stored
    for path, status in [("/v1/embeddings", 200), ("/v1/completions", 200),
                         ("/v1/models/fake-model", 200), ("/v1/models/no-such-model", 404)]:
        hits = access_paths(proxy, path)
        assert hits and hits[-1]["status"] == status, path


# -- --no-log: a turn sent but not stored is a promise serve cannot keep ---
@pytest.mark.parametrize("stream", [False, True])
def test_a_request_asking_not_to_be_stored_is_refused_before_anything_happens(
        proxy: ServeProcess, fake: FakeModel, stream: bool) -> None:
    cid = f"nolog-{stream}"
    resp = httpx2.post(proxy.base_url + "/chat/completions", timeout=30,
                       headers={ID: cid, "X-Chatstate-No-Log": "1"},
                       json={"model": "m", "stream": stream, "messages": user("secret")})
    error = assert_openai_error(resp, 400)
    assert error["param"] == "X-Chatstate-No-Log"
    assert "nothing was stored or sent" in error["message"]
    with pytest.raises(ConversationNotFound):
        load(proxy, cid)
    assert fake.request_log == []
