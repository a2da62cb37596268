"""``chatstate serve``: a real proxy process between real clients and the fake model.

Every client here is one we did not write (the openai SDK, curl) or raw HTTP;
each conversation is checked in the store afterwards. The server runs as a
subprocess so that SIGTERM and SIGKILL are real.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from support.serve_helpers import ServeProcess, local_url, serve_env
from support.stores import load_once as load

from chatstate.ops.transfer import render
from chatstate.stores import open_store
from chatstate.testing import FakeModel
from conftest import LOCAL_KINDS

CANARY = "sk-canary-serve-0123456789abcdef"
USER = [{"role": "user", "content": "hello proxy"}]


def tag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as f:
        yield f


@pytest.fixture(autouse=True)
def clean_fake(fake: FakeModel) -> Iterator[None]:
    fake.reset()
    fake.configure(chunk_delay=0.0, latency=0.0, reply_words=6)
    yield


@pytest.fixture(scope="module", params=LOCAL_KINDS)
def proxy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          fake: FakeModel) -> Iterator[ServeProcess]:
    base = tmp_path_factory.mktemp(f"serve-{request.param}")
    url = local_url(request.param, base)
    env = serve_env(base, OPENAI_API_KEY=CANARY)
    with ServeProcess(url, fake.base_url, env, global_args=("--log-format", "json")) as p:
        p.store_url = url  # type: ignore[attr-defined]
        p.base = base  # type: ignore[attr-defined]
        yield p


def post(proxy: ServeProcess, body: dict[str, Any], **headers: str) -> httpx2.Response:
    return httpx2.post(proxy.base_url + "/chat/completions", json=body, headers=headers,
                       timeout=30)


def stream_text(proxy: ServeProcess, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> tuple[str, str]:
    """(conversation id, the text received) of one streamed request over raw HTTP."""
    text = []
    with httpx2.stream("POST", proxy.base_url + "/chat/completions",
                       json={**body, "stream": True}, headers=headers or {},
                       timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        cid = resp.headers["x-chatstate-conversation"]
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    text.append(choice["delta"].get("content") or "")
    return cid, "".join(text)


# -- clients we did not write --------------------------------------------------------------
def test_openai_sdk_sync_plain_and_streamed(proxy: ServeProcess) -> None:
    client = openai.OpenAI(base_url=proxy.base_url, api_key="client-key", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=USER)
    cid = raw.headers["x-chatstate-conversation"]
    reply = raw.parse().choices[0].message.content
    conv = load(proxy.store_url, cid)  # type: ignore[attr-defined]
    assert [(m.role, m.text) for m in conv.messages] == [("user", "hello proxy"),
                                                         ("assistant", reply)]
    assert conv.verify() is None

    with client.chat.completions.with_streaming_response.create(
            model="m", messages=[{"role": "user", "content": "stream please"}],
            stream=True) as resp:
        cid2 = resp.headers["x-chatstate-conversation"]
        received = "".join(c.choices[0].delta.content or "" for c in resp.parse()
                           if c.choices)
    conv2 = load(proxy.store_url, cid2)  # type: ignore[attr-defined]
    assert conv2.messages[-1].role == "assistant"
    assert conv2.messages[-1].text == received
    assert received.startswith("Echo: stream please")
    assert conv2.messages[-1].status == "complete"
    assert conv2.partial is None


def test_openai_sdk_async_plain_and_streamed(proxy: ServeProcess) -> None:
    import asyncio

    async def run() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="k", max_retries=0)
        plain = await client.chat.completions.create(model="m", messages=USER)
        parts = []
        stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
        await client.close()
        return plain.choices[0].message.content or "", "".join(parts)

    plain, streamed = asyncio.run(run())
    assert plain == streamed  # the fake echoes deterministically
    titles = [s for s in open_store(proxy.store_url).list_conversations()  # type: ignore
              if s.title == "hello proxy"]
    assert len(titles) >= 2


def test_curl_plain_and_streamed(proxy: ServeProcess) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip(reason="curl is not installed")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "from curl"}]})
    out = subprocess.run([curl, "-s", "-D", "-", proxy.base_url + "/chat/completions",
                          "-H", "Content-Type: application/json", "-d", body],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    head, _, payload = out.partition("\n\n")  # text mode turned CRLF into LF
    cid = next(line.split(":", 1)[1].strip() for line in head.splitlines()
               if line.lower().startswith("x-chatstate-conversation"))
    assert load(proxy.store_url, cid).messages[-1].text == \
        json.loads(payload)["choices"][0]["message"]["content"]  # type: ignore[attr-defined]
    streamed = subprocess.run(
        [curl, "-sN", proxy.base_url + "/chat/completions", "-H",
         "Content-Type: application/json", "-d",
         json.dumps({**json.loads(body), "stream": True})],
        capture_output=True, text=True, timeout=30, check=True).stdout
    assert streamed.rstrip().endswith("data: [DONE]")


# -- which conversation, and what is new -------------------------------------------------------
def test_history_continues_one_conversation_and_appends_only_new_messages(
        proxy: ServeProcess, fake: FakeModel) -> None:
    first = post(proxy, {"model": "m", "messages": [{"role": "user", "content": "one"}]})
    cid = first.headers["x-chatstate-conversation"]
    reply = first.json()["choices"][0]["message"]
    history = [{"role": "user", "content": "one"}, {"role": reply["role"],
                                                    "content": reply["content"]},
               {"role": "user", "content": "two"}]
    second = post(proxy, {"model": "m", "messages": history})  # no id: found by its history
    assert second.headers["x-chatstate-conversation"] == cid
    conv = load(proxy.store_url, cid)  # type: ignore[attr-defined]
    assert [m.text for m in conv.messages] == ["one", reply["content"], "two",
                                               second.json()["choices"][0]["message"]["content"]]
    assert conv.verify() is None
    assert len(fake.request_log[-1]["messages"]) == 3  # the client's request, unchanged


def test_header_and_metadata_name_the_conversation(proxy: ServeProcess,
                                                   fake: FakeModel) -> None:
    r = post(proxy, {"model": "m", "messages": USER}, **{"X-Chatstate-Conversation": "by-hdr"})
    assert r.headers["x-chatstate-conversation"] == "by-hdr"
    r = post(proxy, {"model": "m", "messages": USER,
                     "metadata": {"conversation_id": "by-meta", "app": "x"}})
    assert r.headers["x-chatstate-conversation"] == "by-meta"
    assert fake.request_log[-1]["body"]["metadata"] == {"app": "x"}  # our field stripped
    assert load(proxy.store_url, "by-meta").messages[0].text == "hello proxy"  # type: ignore


def test_a_diverging_history_forks(proxy: ServeProcess) -> None:
    first = post(proxy, {"model": "m", "messages": [{"role": "user", "content": "root"}]},
                 **{"X-Chatstate-Conversation": "fork-src"})
    answer = first.json()["choices"][0]["message"]["content"]
    post(proxy, {"model": "m", "messages": [
        {"role": "user", "content": "root"}, {"role": "assistant", "content": answer},
        {"role": "user", "content": "branch A"}]}, **{"X-Chatstate-Conversation": "fork-src"})
    edited = post(proxy, {"model": "m", "messages": [
        {"role": "user", "content": "root"}, {"role": "assistant", "content": answer},
        {"role": "user", "content": "branch B"}]}, **{"X-Chatstate-Conversation": "fork-src"})
    fork_id = edited.headers["x-chatstate-conversation"]
    assert fork_id != "fork-src"
    source = load(proxy.store_url, "fork-src")  # type: ignore[attr-defined]
    fork = load(proxy.store_url, fork_id)  # type: ignore[attr-defined]
    assert [m.text for m in source.messages][2] == "branch A"  # never rewritten
    assert [m.text for m in fork.messages][:3] == ["root", answer, "branch B"]
    assert fork.metadata["forked_from"] == {"id": "fork-src", "seq": 1,
                                            "hash": source.messages[1].hash}
    assert fork.verify() is None


def test_invalid_conversation_id_is_refused(proxy: ServeProcess) -> None:
    r = post(proxy, {"model": "m", "messages": USER}, **{"X-Chatstate-Conversation": "../x"})
    assert r.status_code == 400
    assert "invalid conversation id" in r.json()["error"]["message"]


# -- persist before the client sees it ------------------------------------------------------
@pytest.mark.invariant(2)
def test_every_streamed_chunk_is_stored_before_the_client_gets_it(
        proxy: ServeProcess, fake: FakeModel) -> None:
    fake.configure(chunk_delay=0.03, reply_words=12)
    shown = ""
    checks = 0
    with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=30,
                       json={"model": "m", "stream": True, "messages": [
                           {"role": "user", "content": "stored before shown"}]}) as resp:
        cid = resp.headers["x-chatstate-conversation"]
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                shown += chunk["choices"][0]["delta"]["content"]
                conv = load(proxy.store_url, cid)  # type: ignore[attr-defined]
                stored = conv.partial or conv.messages[-1]
                assert stored.role == "assistant"
                assert stored.text.startswith(shown)
                checks += 1
    assert checks >= 10
    assert load(proxy.store_url, cid).messages[-1].text == shown  # type: ignore


@pytest.mark.invariant(2)
def test_client_disconnect_leaves_the_reply_partial(proxy: ServeProcess,
                                                    fake: FakeModel) -> None:
    fake.configure(chunk_delay=0.15, reply_words=40)
    shown = ""
    with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=30,
                       json={"model": "m", "stream": True, "messages": USER},
                       headers={"X-Chatstate-Conversation": "gone-away"}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                shown += chunk["choices"][0]["delta"].get("content") or ""
                if len(shown) > 12:
                    break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        conv = load(proxy.store_url, "gone-away")  # type: ignore[attr-defined]
        if conv.partial is not None and any(
                "gone-away" in line and "left as partial" in line for line in proxy.lines):
            break
        time.sleep(0.1)
    assert conv.partial is not None, proxy.stderr
    assert conv.partial.text.startswith(shown)
    assert conv.messages[-1].role == "user"
    # The same request again answers that turn; the cut reply stays in the chain, partial.
    fake.configure(chunk_delay=0.0)
    post(proxy, {"model": "m", "messages": USER}, **{"X-Chatstate-Conversation": "gone-away"})
    conv = load(proxy.store_url, "gone-away")  # type: ignore[attr-defined]
    assert [(m.role, m.status) for m in conv.messages] == [
        ("user", "complete"), ("assistant", "partial"), ("assistant", "complete")]
    assert conv.messages[1].text.startswith(shown)
    assert len({m.turn_id for m in conv.messages}) == 1
    assert conv.verify() is None


@pytest.mark.invariant(1)
def test_upstream_error_reaches_the_client_and_the_transcript(proxy: ServeProcess,
                                                              fake: FakeModel) -> None:
    fake.fail_next(400, message="model 'nope' does not exist")
    r = post(proxy, {"model": "nope", "messages": USER}, **{"X-Chatstate-Conversation": "e400"})
    assert r.status_code == 400
    assert "does not exist" in r.json()["error"]["message"]
    conv = load(proxy.store_url, "e400")  # type: ignore[attr-defined]
    assert [m.role for m in conv.messages] == ["user"]  # stored before the call; no reply
    assert conv.metadata["last_upstream_error"]["status"] == 400
    fake.fail_next(503)
    with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=30, json={
            "model": "m", "stream": True,  # a request not seen before (that one is replayed)
            "messages": [{"role": "user", "content": "streamed into a 503"}]}) as resp:
        assert resp.status_code == 503


# -- pass-through and management --------------------------------------------------------------
def test_models_health_and_readiness(proxy: ServeProcess) -> None:
    models = httpx2.get(proxy.base_url + "/models", timeout=10)
    assert models.status_code == 200
    assert models.json()["data"]
    health = httpx2.get(proxy.root + "/healthz", timeout=10).json()
    assert health["status"] == "ok"
    assert health["durability"] == "durable"
    assert health["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    ready = httpx2.get(proxy.root + "/readyz", timeout=10)
    assert ready.status_code == 200
    assert ready.json()["ready"] is True
    assert ready.json()["store"]["check"]["ok"] is True


def test_conversations_over_http_match_replay_json(proxy: ServeProcess) -> None:
    post(proxy, {"model": "m", "messages": USER}, **{"X-Chatstate-Conversation": "listed"})
    rows = httpx2.get(proxy.base_url + "/chatstate/conversations", timeout=10).json()["data"]
    assert "listed" in [r["id"] for r in rows]
    got = httpx2.get(proxy.base_url + "/chatstate/conversations/listed", timeout=10)
    assert got.json() == json.loads(render(load(proxy.store_url, "listed"), "json"))  # type: ignore
    assert httpx2.get(proxy.base_url + "/chatstate/conversations/nope", timeout=10
                      ).status_code == 404
    bad = httpx2.get(proxy.base_url + "/chatstate/conversations/bad%20id", timeout=10)
    assert bad.status_code == 400
    assert "invalid conversation id" in bad.json()["error"]["message"]


def test_tools_and_content_parts_pass_through_and_are_stored(proxy: ServeProcess,
                                                             fake: FakeModel) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this"}, image]}]
    r = post(proxy, {"model": "m", "messages": messages, "tools": tools, "tool_choice": "auto"},
             **{"X-Chatstate-Conversation": "parts"})
    assert r.status_code == 200
    sent = fake.request_log[-1]["body"]
    assert sent["tools"] == tools
    assert sent["tool_choice"] == "auto"
    assert sent["messages"] == messages
    stored = load(proxy.store_url, "parts").messages[0]  # type: ignore[attr-defined]
    assert stored.content == messages[0]["content"]


@pytest.mark.invariant(9)
def test_keys_stay_out_of_the_store_and_the_logs(proxy: ServeProcess, fake: FakeModel) -> None:
    post(proxy, {"model": "m", "messages": [{"role": "user", "content": "keys stay out"}]},
         Authorization="Bearer client-secret-1")
    assert fake.request_log[-1]["authorization_fingerprint"] == tag(f"Bearer {CANARY}")
    base: Path = proxy.base  # type: ignore[attr-defined]
    for path in base.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert CANARY.encode() not in data, path
            assert b"client-secret-1" not in data, path
    assert CANARY not in proxy.stderr
    assert "client-secret-1" not in proxy.stderr


def test_access_log_is_json_lines(proxy: ServeProcess) -> None:
    post(proxy, {"model": "m", "messages": USER}, **{"X-Chatstate-Conversation": "logged"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        entries = [json.loads(line) for line in proxy.lines if line.startswith("{")]
        hits = [e for e in entries if e.get("logger") == "chatstate.serve.access"
                and e.get("conversation") == "logged"]
        if hits:
            break
        time.sleep(0.05)
    assert hits
    assert hits[0]["status"] == 200
    assert hits[0]["path"] == "/v1/chat/completions"
    assert hits[0]["ms"] >= 0


# -- each on a server of its own ------------------------------------------------------------------
def test_plain_turns_on_every_store(store_url: str, tmp_path: Path, fake: FakeModel) -> None:
    with ServeProcess(store_url, fake.base_url, serve_env(tmp_path)) as p:
        first = post(p, {"model": "m", "messages": USER})
        cid = first.headers["x-chatstate-conversation"]
        reply = first.json()["choices"][0]["message"]["content"]
        post(p, {"model": "m", "messages": [*USER, {"role": "assistant", "content": reply},
                                            {"role": "user", "content": "more"}]})
        ready = httpx2.get(p.root + "/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
    conv = load(store_url, cid)
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    assert conv.verify() is None


def test_non_loopback_without_tokens_refuses_to_start(tmp_path: Path) -> None:
    from support.cli_helpers import run_cli

    result = run_cli(["serve", "--host", "0.0.0.0", "--upstream", "http://127.0.0.1:9"],
                     serve_env(tmp_path), store=local_url("sqlite", tmp_path))
    assert result.code == 2
    assert "refusing to listen on 0.0.0.0 without client tokens" in result.err
    assert not (tmp_path / "s.db").exists()  # refused before the store was opened


def test_tokens_are_required_when_given(tmp_path: Path, fake: FakeModel) -> None:
    env = serve_env(tmp_path, CHATSTATE_SERVE_TOKENS="tok-env")
    with ServeProcess(local_url("sqlite", tmp_path), fake.base_url, env,
                      "--token", "tok-flag") as p:
        assert post(p, {"model": "m", "messages": USER}).status_code == 401
        assert post(p, {"model": "m", "messages": USER},
                    Authorization="Bearer wrong").status_code == 401
        assert httpx2.get(p.base_url + "/chatstate/conversations", timeout=10
                          ).status_code == 401
        for token in ("tok-flag", "tok-env"):
            assert post(p, {"model": "m", "messages": USER},
                        Authorization=f"Bearer {token}").status_code == 200
        assert httpx2.get(p.root + "/healthz", timeout=10).status_code == 200
        assert "tok-flag" not in p.stderr
        assert "tok-env" not in p.stderr


def test_pass_client_key_forwards_the_clients_key(tmp_path: Path, fake: FakeModel) -> None:
    env = serve_env(tmp_path, OPENAI_API_KEY=CANARY)
    with ServeProcess(local_url("json", tmp_path), fake.base_url, env, "--pass-client-key",
                      "--token", "t1") as p:
        r = post(p, {"model": "m", "messages": USER}, Authorization="Bearer client-own",
                 **{"X-Chatstate-Token": "t1"})
        assert r.status_code == 200
        assert fake.request_log[-1]["authorization_fingerprint"] == tag("Bearer client-own")
        assert post(p, {"model": "m", "messages": USER},
                    Authorization="Bearer client-own").status_code == 401


def test_request_body_limit(tmp_path: Path, fake: FakeModel) -> None:
    with ServeProcess(local_url("sqlite", tmp_path), fake.base_url, serve_env(tmp_path),
                      "--max-body", "2KiB") as p:
        big = [{"role": "user", "content": "x" * 4096}]
        r = post(p, {"model": "m", "messages": big})
        assert r.status_code == 413
        assert "--max-body" in r.json()["error"]["message"]
        assert fake.request_log == []  # nothing went upstream
        assert post(p, {"model": "m", "messages": USER}).status_code == 200


def test_readyz_fails_when_the_store_cannot_be_written(tmp_path: Path, fake: FakeModel) -> None:
    with ServeProcess(local_url("json", tmp_path), fake.base_url, serve_env(tmp_path),
                      "--ready-upstream", "--ready-cache", "0") as p:
        assert httpx2.get(p.root + "/readyz", timeout=10).status_code == 200
        store_dir = tmp_path / "store"
        store_dir.rename(tmp_path / "moved")
        store_dir.write_text("not a directory")
        ready = httpx2.get(p.root + "/readyz", timeout=10)
        assert ready.status_code == 503
        assert "store check failed" in ready.json()["reason"]


def test_readyz_checks_the_upstream_when_asked(tmp_path: Path) -> None:
    with ServeProcess(local_url("sqlite", tmp_path), "http://127.0.0.1:9/v1",
                      serve_env(tmp_path), "--ready-upstream") as p:
        ready = httpx2.get(p.root + "/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json()["upstream"]["ok"] is False
        assert "upstream not ready" in ready.json()["reason"]


def test_sigterm_drains_streams_in_flight(tmp_path: Path, fake: FakeModel) -> None:
    fake.configure(chunk_delay=0.1, reply_words=20)
    url = local_url("sqlite", tmp_path)
    p = ServeProcess(url, fake.base_url, serve_env(tmp_path), "--drain", "30")
    result: dict[str, Any] = {}
    first_chunk = threading.Event()

    def client() -> None:
        text = []
        with httpx2.stream("POST", p.base_url + "/chat/completions", timeout=30,
                           json={"model": "m", "stream": True, "messages": USER},
                           headers={"X-Chatstate-Conversation": "drained"}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                    text.append(delta)
                    first_chunk.set()
                elif line == "data: [DONE]":
                    result["done"] = True
        result["text"] = "".join(text)

    thread = threading.Thread(target=client)
    thread.start()
    assert first_chunk.wait(20)
    # uvicorn drains, then re-raises the signal: the exit status is "terminated by SIGTERM".
    assert p.terminate(timeout=60) in (0, -15)
    thread.join(30)
    assert result.get("done") is True
    assert load(url, "drained").messages[-1].text == result["text"]


@pytest.mark.invariant(2)
def test_kill_9_under_load_loses_nothing_any_client_received(tmp_path: Path, fake: FakeModel,
                                                             ) -> None:
    fake.configure(chunk_delay=0.02, reply_words=80)
    url = local_url("sqlite", tmp_path)
    env = serve_env(tmp_path)
    p = ServeProcess(url, fake.base_url, env)
    received: dict[str, str] = {}
    started = threading.Barrier(9)

    def client(n: int) -> None:
        cid, text = f"load-{n}", []
        try:
            with httpx2.stream("POST", p.base_url + "/chat/completions", timeout=30,
                               json={"model": "m", "stream": True, "messages": USER},
                               headers={"X-Chatstate-Conversation": cid}) as resp:
                started.wait(20)
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if chunk["choices"]:
                            text.append(chunk["choices"][0]["delta"].get("content") or "")
        except (httpx2.HTTPError, threading.BrokenBarrierError):
            pass
        received[cid] = "".join(text)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    started.wait(20)
    time.sleep(0.4)
    p.kill()
    for t in threads:
        t.join(30)
    assert any(received.values())
    with ServeProcess(url, fake.base_url, env) as again:
        for cid, text in received.items():
            conv = load(url, cid)
            kept = conv.partial or conv.messages[-1]
            assert kept.text.startswith(text), (cid, text, kept)
            assert conv.partial is not None or kept.status == "complete"
        fake.configure(chunk_delay=0.0)
        post(again, {"model": "m", "messages": USER}, **{"X-Chatstate-Conversation": "load-0"})
        statuses = [m.status for m in load(url, "load-0").messages if m.role == "assistant"]
        assert statuses[-1] == "complete"


def test_doctor_reports_a_running_proxy(proxy: ServeProcess, tmp_path: Path) -> None:
    from support.cli_helpers import cli_env, run_cli

    url = local_url("sqlite", tmp_path)
    ok = run_cli(["doctor", "--serve-url", proxy.root, "--json"], cli_env(tmp_path), store=url)
    assert ok.code == 0, ok.err
    assert json.loads(ok.out)["serve"]["ready"] is True
    down = run_cli(["doctor", "--serve-url", "http://127.0.0.1:9"], cli_env(tmp_path),
                   store=url)
    assert down.code == 1
    assert "NOT READY" in down.out
    assert "chatstate serve at http://127.0.0.1:9/readyz is not ready" in down.out


@pytest.mark.invariant(2)
def test_streamed_tool_calls_reach_the_client_only_once_stored(proxy: ServeProcess,
                                                               fake: FakeModel) -> None:
    fake.add_tool_rule(contains="weather", calls=[{"name": "get_weather",
                                                   "arguments": {"city": "Oslo"}}])
    fake.configure(arg_chunk=1, chunk_delay=0.01)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    pieces = []
    with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=30, json={
            "model": "m", "stream": True, "tools": tools,
            "messages": [{"role": "user", "content": "weather in Oslo?"}]},
            headers={"X-Chatstate-Conversation": "tool-stream"}) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            for call in delta.get("tool_calls") or []:
                # the call is in the store before any piece of it reaches the client
                stored = load(proxy.store_url, "tool-stream").messages[-1]  # type: ignore
                assert stored.role == "assistant"
                assert stored.tool_calls
                pieces.append(call.get("function", {}).get("arguments") or "")
    (call,) = load(proxy.store_url, "tool-stream").messages[-1].tool_calls  # type: ignore
    assert call["function"]["name"] == "get_weather"
    assert "".join(pieces) == call["function"]["arguments"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert len(pieces) > 5  # it really came in pieces


@pytest.mark.invariant(9)
def test_upstream_error_bodies_are_redacted_relayed_and_stored(proxy: ServeProcess,
                                                               fake: FakeModel) -> None:
    echoed = f"Incorrect API key provided: Bearer {CANARY} (sk-otherkey0123456789)"
    for stream in (False, True):
        cid = f"e401-{int(stream)}"
        fake.fail_next(401, message=echoed)
        r = post(proxy, {"model": "m", "messages": USER, "stream": stream},
                 **{"X-Chatstate-Conversation": cid})
        assert r.status_code == 401
        assert CANARY not in r.text and "otherkey0123456789" not in r.text
        assert "Incorrect API key provided" in r.json()["error"]["message"]
        stored = load(proxy.store_url, cid).metadata["last_upstream_error"]  # type: ignore
        assert CANARY not in stored["detail"] and "otherkey0123456789" not in stored["detail"]
        assert "[redacted]" in stored["detail"]
