"""``chatstate serve``: whose conversation it is (issue 22, identity and isolation).

A real proxy process in front of the fake model; every check reads the store back.
Each token (or, with ``--pass-client-key``, each upstream key) is a namespace; a
request names its conversation by header, base URL or body field, or the history
picks it only when exactly one conversation of the namespace matches; a retried
request answers the turn it already has.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from support.cli_helpers import run_cli
from support.serve_helpers import ServeProcess, local_url, serve_env
from support.stores import load_once as load

from chatstate.stores import open_store
from chatstate.testing import FakeModel

ALICE, BOB = "tok-alice-7f3a9c", "tok-bob-2d8e41"


def ids(url: str) -> set[str]:
    store = open_store(url)
    try:
        return {s.id for s in store.list_conversations()}
    finally:
        store.close()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=4) as f:
        yield f


@pytest.fixture(autouse=True)
def clean_fake(fake: FakeModel) -> Iterator[None]:
    fake.reset()
    fake.configure(chunk_delay=0.0, latency=0.0, reply_words=4)
    yield


@pytest.fixture(scope="module")
def tokened(tmp_path_factory: pytest.TempPathFactory, fake: FakeModel) -> Iterator[ServeProcess]:
    """A proxy with two client tokens on sqlite (a store that searches)."""
    base = tmp_path_factory.mktemp("serve-ns")
    url = local_url("sqlite", base)
    with ServeProcess(url, fake.base_url, serve_env(base), "--token", ALICE,
                      "--token", BOB) as p:
        p.store_url = url  # type: ignore[attr-defined]
        yield p


@pytest.fixture(scope="module")
def open_proxy(tmp_path_factory: pytest.TempPathFactory,
               fake: FakeModel) -> Iterator[ServeProcess]:
    """A proxy without tokens (the loopback default) on json."""
    base = tmp_path_factory.mktemp("serve-open")
    url = local_url("json", base)
    with ServeProcess(url, fake.base_url, serve_env(base)) as p:
        p.store_url = url  # type: ignore[attr-defined]
        yield p


def post(p: ServeProcess, body: dict[str, Any], token: str | None = None,
         base: str | None = None, **headers: str) -> httpx2.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.post((base or p.base_url) + "/chat/completions", json=body, headers=headers,
                       timeout=30)


def turn(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def reply_of(r: httpx2.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    message: dict[str, Any] = r.json()["choices"][0]["message"]
    return {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}


def listing(p: ServeProcess, token: str, **params: Any) -> dict[str, Any]:
    r = httpx2.get(p.base_url + "/chatstate/conversations", params=params,
                   headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


# -- 1, 19: tokens at start ---------------------------------------------------------------
@pytest.mark.parametrize("args,env", [(["--token", ""], {}), (["--token", " "], {}),
                                      ([], {"CHATSTATE_SERVE_TOKENS": ""})],
                         ids=["empty", "blank", "empty-variable"])
def test_an_empty_or_blank_token_is_refused_at_start(tmp_path: Path, args: list[str],
                                                     env: dict[str, str]) -> None:
    result = run_cli(["serve", "--upstream", "http://127.0.0.1:9", "--port", "0", *args],
                     serve_env(tmp_path, **env), store=local_url("sqlite", tmp_path),
                     timeout=30)
    assert result.code == 2
    assert "empty or blank" in result.err and "--token" in result.err
    assert not (tmp_path / "s.db").exists()


def test_tokens_from_a_file_stay_out_of_ps(tmp_path: Path, fake: FakeModel) -> None:
    path = tmp_path / "tokens"
    path.write_text("# clients\ntok-from-file-1\n\ntok-from-file-2\n")
    with ServeProcess(local_url("sqlite", tmp_path), fake.base_url, serve_env(tmp_path),
                      "--token-file", str(path)) as p:
        assert post(p, turn("hi")).status_code == 401
        for token in ("tok-from-file-1", "tok-from-file-2"):
            assert post(p, turn("hi " + token[-1]), token).status_code == 200
        cmdline = Path(f"/proc/{p.proc.pid}/cmdline").read_bytes().decode()
        assert "tok-from-file" not in cmdline
        assert "tok-from-file" not in p.stderr


def test_the_start_line_brackets_an_ipv6_host(tmp_path: Path, fake: FakeModel) -> None:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))  # the machine has IPv6 loopback (an OSError fails the test)
    with ServeProcess(local_url("sqlite", tmp_path), fake.base_url, serve_env(tmp_path),
                      "--host", "::1") as p:
        assert p.base_url.startswith("http://[::1]:")
        assert post(p, turn("over ipv6")).status_code == 200


# -- 2: each token is a namespace -----------------------------------------------------------
def test_each_token_sees_and_writes_only_its_own_conversations(tokened: ServeProcess) -> None:
    url = tokened.store_url  # type: ignore[attr-defined]
    first = post(tokened, turn("alice: my PIN is 4321"), ALICE)
    alice = first.headers["x-chatstate-conversation"]
    history = [{"role": "user", "content": "alice: my PIN is 4321"}, reply_of(first),
               {"role": "user", "content": "and my name?"}]
    # Bob sends Alice's exact history, header-less, then names her conversation
    bob = post(tokened, {"model": "m", "messages": history}, BOB)
    assert bob.headers["x-chatstate-conversation"] != alice
    named = post(tokened, turn("bob writes here"), BOB, **{"X-Chatstate-Conversation": alice})
    assert named.status_code == 404
    assert [m.text for m in load(url, alice).messages] == [
        "alice: my PIN is 4321", reply_of(first)["content"]]
    assert alice not in {c["id"] for c in listing(tokened, BOB)["data"]}
    assert alice in {c["id"] for c in listing(tokened, ALICE)["data"]}
    r = httpx2.get(f"{tokened.base_url}/chatstate/conversations/{alice}", timeout=30,
                   headers={"Authorization": f"Bearer {BOB}"})
    assert r.status_code == 404
    stored = load(url, alice).metadata["namespace"]
    assert ALICE not in json.dumps(load(url, alice).model_dump())  # a digest, not the token
    assert stored != load(url, bob.headers["x-chatstate-conversation"]).metadata["namespace"]


def test_with_pass_client_key_each_upstream_key_is_a_namespace(tmp_path: Path,
                                                               fake: FakeModel) -> None:
    url = local_url("json", tmp_path)
    with ServeProcess(url, fake.base_url, serve_env(tmp_path), "--pass-client-key",
                      "--token", "t1") as p:
        def as_key(key: str, text: str) -> httpx2.Response:
            return post(p, turn(text), Authorization=f"Bearer {key}",
                        **{"X-Chatstate-Token": "t1"})

        mine = as_key("sk-key-one", "one").headers["x-chatstate-conversation"]
        as_key("sk-key-two", "two")
        seen = httpx2.get(p.base_url + "/chatstate/conversations", timeout=30, headers={
            "Authorization": "Bearer sk-key-two", "X-Chatstate-Token": "t1"}).json()
        assert mine not in {c["id"] for c in seen["data"]} and len(seen["data"]) == 1
        assert "sk-key-one" not in (tmp_path / "store" / f"{mine}.json").read_text()


def test_a_history_matching_two_conversations_starts_a_new_one(open_proxy: ServeProcess
                                                                ) -> None:
    url = open_proxy.store_url  # type: ignore[attr-defined]
    replies = [post(open_proxy, turn("same question"), **{"X-Chatstate-Conversation": cid})
               for cid in ("twin-a", "twin-b")]
    assert reply_of(replies[0]) == reply_of(replies[1])  # the fake answers alike
    history = [{"role": "user", "content": "same question"}, reply_of(replies[0]),
               {"role": "user", "content": "my secret follow-up"}]
    r = post(open_proxy, {"model": "m", "messages": history})  # no id: history decides
    cid = r.headers["x-chatstate-conversation"]
    assert cid not in ("twin-a", "twin-b")
    for twin in ("twin-a", "twin-b"):
        assert len(load(url, twin).messages) == 2  # neither was picked
    conv = load(url, cid)
    assert sorted(conv.metadata["ambiguous_history"]["matched"]) == ["twin-a", "twin-b"]
    assert [m.text for m in conv.messages][:3] == [m["content"] for m in history]


# -- 3: ids for clients that cannot set headers ------------------------------------------------
def test_the_base_url_and_body_fields_name_the_conversation(open_proxy: ServeProcess,
                                                            fake: FakeModel) -> None:
    url = open_proxy.store_url  # type: ignore[attr-defined]
    client = openai.OpenAI(base_url=open_proxy.root + "/c/by-url/v1", api_key="k",
                           max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "via the url"}])
    assert raw.headers["x-chatstate-conversation"] == "by-url"
    assert client.models.list() is not None  # the other routes work under /c/<id> too
    assert load(url, "by-url").messages[0].text == "via the url"

    r = post(open_proxy, {**turn("via user"), "user": "chatstate:by-user"})
    assert r.headers["x-chatstate-conversation"] == "by-user"
    assert "user" not in fake.request_log[-1]["body"]  # ours, taken out
    r = post(open_proxy, {**turn("via metadata"), "user": "end-user-9",
                          "metadata": {"chatstate_conversation": "by-meta2", "app": "x"}})
    assert r.headers["x-chatstate-conversation"] == "by-meta2"
    assert fake.request_log[-1]["body"]["user"] == "end-user-9"  # the client's, kept
    assert fake.request_log[-1]["body"]["metadata"] == {"app": "x"}
    assert load(url, "by-meta2").messages[0].text == "via metadata"


# -- 4: the browser guards ----------------------------------------------------------------------
def test_non_json_posts_and_foreign_hosts_are_refused(open_proxy: ServeProcess,
                                                      fake: FakeModel) -> None:
    url = open_proxy.store_url  # type: ignore[attr-defined]
    before = ids(url)
    body = json.dumps(turn("csrf attempt"))
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": ctype} if ctype else {}
        r = httpx2.post(open_proxy.base_url + "/chat/completions", content=body,
                        headers=headers, timeout=30)
        assert r.status_code == 415, (ctype, r.text)
        assert "application/json" in r.json()["error"]["message"]
    port = open_proxy.base_url.split(":")[2].split("/")[0]
    r = post(open_proxy, turn("rebinding attempt"), Host=f"attacker.example:{port}")
    assert r.status_code == 421
    assert "--allow-host" in r.json()["error"]["message"]
    assert httpx2.get(open_proxy.root + "/healthz", headers={"Host": "attacker.example"},
                      timeout=30).status_code == 421
    assert fake.request_log == [] and ids(url) == before  # nothing stored, nothing sent
    assert post(open_proxy, turn("by name"), Host=f"localhost:{port}").status_code == 200


def test_allow_host_adds_a_name(tmp_path: Path, fake: FakeModel) -> None:
    with ServeProcess(local_url("sqlite", tmp_path), fake.base_url, serve_env(tmp_path),
                      "--allow-host", "proxy.internal") as p:
        assert post(p, turn("x"), Host="proxy.internal:8080").status_code == 200
        assert post(p, turn("x"), Host="other.internal").status_code == 421


# -- 12: a retried request answers the same turn -------------------------------------------------
def test_the_sdks_retries_after_a_503_make_one_conversation(open_proxy: ServeProcess,
                                                            fake: FakeModel) -> None:
    url = open_proxy.store_url  # type: ignore[attr-defined]
    before = ids(url)
    fake.fail_next(503, times=2)
    client = openai.OpenAI(base_url=open_proxy.base_url, api_key="k", max_retries=2)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "retried question"}])
    assert len(fake.request_log) == 3
    new = ids(url) - before
    assert new == {raw.headers["x-chatstate-conversation"]}
    conv = load(url, new.pop())
    assert [m.text for m in conv.messages] == ["retried question",
                                               raw.parse().choices[0].message.content]


def test_the_same_request_again_replays_the_stored_turn(open_proxy: ServeProcess,
                                                        fake: FakeModel) -> None:
    url = open_proxy.store_url  # type: ignore[attr-defined]
    body = turn("ask once, answer once")
    first = post(open_proxy, body)
    again = post(open_proxy, body)
    cid = first.headers["x-chatstate-conversation"]
    assert again.headers["x-chatstate-conversation"] == cid
    assert again.headers["x-chatstate-replayed"] == "true"
    assert reply_of(again) == reply_of(first)
    keyed = {"Idempotency-Key": "op-77"}
    one = post(open_proxy, turn("keyed"), **keyed)
    with httpx2.stream("POST", open_proxy.base_url + "/chat/completions", timeout=30,
                       json={**turn("keyed"), "stream": True}, headers=keyed) as resp:
        text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                       for line in resp.iter_lines()
                       if line.startswith("data: ") and line != "data: [DONE]"
                       and json.loads(line[6:])["choices"])
    assert resp.headers["x-chatstate-conversation"] == one.headers["x-chatstate-conversation"]
    assert text == reply_of(one)["content"]
    assert len(fake.request_log) == 2  # neither repeat went upstream
    assert len(load(url, cid).messages) == 2


def test_a_retry_after_kill_9_continues_the_same_conversation(tmp_path: Path,
                                                              fake: FakeModel) -> None:
    url = local_url("sqlite", tmp_path)
    env = serve_env(tmp_path)
    body = {**turn("cut by kill -9"), "stream": True}
    fake.hang_next(30)
    with ServeProcess(url, fake.base_url, env) as p:
        def send() -> None:
            with contextlib.suppress(httpx2.HTTPError):  # the proxy dies under it
                httpx2.post(p.base_url + "/chat/completions", json=body, timeout=60)

        threading.Thread(target=send, daemon=True).start()
        deadline = time.monotonic() + 30
        while not ids(url) and time.monotonic() < deadline:
            time.sleep(0.05)
        (cid,) = ids(url)
        p.kill()
    fake.reset()
    with ServeProcess(url, fake.base_url, env) as p, httpx2.stream(  # the retry: same body
            "POST", p.base_url + "/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        resp.read()
    assert resp.headers["x-chatstate-conversation"] == cid
    assert ids(url) == {cid}
    conv = load(url, cid)
    assert [m.role for m in conv.messages if m.status == "complete"] == ["user", "assistant"]
    assert conv.verify() is None


def test_an_unanswered_turn_sent_again_with_another_body_answers_that_turn(
        tmp_path: Path, fake: FakeModel) -> None:
    """After a restart, a history whose last turn is stored unanswered is that turn again,
    even when its body (so its request key) differs: a client rebuilds it from what it
    was sent. A first question is never guessed so: two clients may ask the same one."""
    url = local_url("sqlite", tmp_path)
    env = serve_env(tmp_path)
    cid = "x-chatstate-conversation"
    with ServeProcess(url, fake.base_url, env) as p:
        first = post(p, turn("keep one history"))
        history = [{"role": "user", "content": "keep one history"}, reply_of(first),
                   {"role": "user", "content": "and then?"}]
        fake.fail_next(500, times=2)
        assert post(p, {"model": "m", "messages": history, "temperature": 0.1}
                    ).status_code == 500
        lone = post(p, {**turn("a first question that fails"), "temperature": 0.1})
        assert lone.status_code == 500
        p.kill()
    with ServeProcess(url, fake.base_url, env) as p:
        again = post(p, {"model": "m", "messages": history, "temperature": 0.2})
        fresh = post(p, {**turn("a first question that fails"), "temperature": 0.2})
    assert again.headers[cid] == first.headers[cid]
    assert [m.role for m in load(url, again.headers[cid]).messages] == [
        "user", "assistant", "user", "assistant"]
    assert fresh.status_code == 200 and fresh.headers[cid] != lone.headers[cid]
    assert len(ids(url)) == 3


# -- 13: tool-call arguments re-serialised ---------------------------------------------------
def test_reserialised_tool_arguments_stay_in_one_conversation(open_proxy: ServeProcess,
                                                              fake: FakeModel) -> None:
    fake.add_tool_rule(contains="weather", calls=[
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}])
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    ask = {"model": "m", "tools": tools,
           "messages": [{"role": "user", "content": "weather in Paris?"}]}
    first = post(open_proxy, ask)
    cid = first.headers["x-chatstate-conversation"]
    call = reply_of(first)["tool_calls"][0]
    # as LangChain and llm send it back: parsed, then dumped again with other spacing
    again = json.dumps(json.loads(call["function"]["arguments"]), indent=1, sort_keys=True)
    assert again != call["function"]["arguments"]
    echoed = {"role": "assistant", "content": None, "tool_calls": [
        {**call, "function": {**call["function"], "arguments": again}}]}
    second = post(open_proxy, {**ask, "messages": [
        *ask["messages"], echoed, {"role": "tool", "tool_call_id": call["id"],
                                   "content": "18 C"}]})
    assert second.headers["x-chatstate-conversation"] == cid
    conv = load(open_proxy.store_url, cid)  # type: ignore[attr-defined]
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]


# -- 14: a fixed id follows its fork ------------------------------------------------------------
def test_a_fixed_id_follows_the_fork_it_made(open_proxy: ServeProcess) -> None:
    url = open_proxy.store_url  # type: ignore[attr-defined]
    hdr = {"X-Chatstate-Conversation": "fixed-id"}
    one = reply_of(post(open_proxy, turn("root"), **hdr))
    post(open_proxy, {"model": "m", "messages": [
        {"role": "user", "content": "root"}, one, {"role": "user", "content": "branch A"}]},
        **hdr)
    edited = [{"role": "user", "content": "root"}, one, {"role": "user", "content": "B"}]
    fork_r = post(open_proxy, {"model": "m", "messages": edited}, **hdr)
    fork = fork_r.headers["x-chatstate-conversation"]
    assert fork != "fixed-id"
    later = [*edited, reply_of(fork_r), {"role": "user", "content": "B, continued"}]
    r = post(open_proxy, {"model": "m", "messages": later}, **hdr)
    assert r.headers["x-chatstate-conversation"] == fork  # no second fork
    assert [m.text for m in load(url, fork).messages][-2] == "B, continued"
    assert len(load(url, "fixed-id").messages) == 4


# -- 19: titles ------------------------------------------------------------------
def test_a_content_part_first_message_is_titled_by_its_text(open_proxy: ServeProcess) -> None:
    r = post(open_proxy, {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Describe   this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "text", "text": "picture"}]}]})
    conv = load(open_proxy.store_url, r.headers["x-chatstate-conversation"])  # type: ignore
    assert conv.title == "Describe this picture"


# -- the conversations endpoint: pages, search, delete, within the namespace -------------------
def test_conversations_page_search_and_delete_within_the_namespace(tokened: ServeProcess
                                                                   ) -> None:
    url = tokened.store_url  # type: ignore[attr-defined]
    mine = [post(tokened, turn(f"paging note {word}"), ALICE, **{
        "X-Chatstate-Conversation": f"page-{word}"}).headers["x-chatstate-conversation"]
            for word in ("alpha", "beta", "gamma")]
    post(tokened, turn("paging note delta"), BOB)
    seen: list[str] = []
    page = listing(tokened, ALICE, limit=2)
    while True:
        seen += [c["id"] for c in page["data"]]
        assert len(page["data"]) <= 2
        if not page["has_more"]:
            break
        page = listing(tokened, ALICE, limit=2, after=page["last_id"])
    assert set(mine) <= set(seen) and len(seen) == len(set(seen))
    assert [c["id"] for c in listing(tokened, ALICE, q="gamma")["data"]] == ["page-gamma"]
    assert listing(tokened, BOB, q="gamma")["data"] == []
    auth = {"Authorization": f"Bearer {BOB}"}
    gone = f"{tokened.base_url}/chatstate/conversations/page-beta"
    assert httpx2.delete(gone, headers=auth, timeout=30).status_code == 404  # not Bob's
    assert "page-beta" in ids(url)
    auth = {"Authorization": f"Bearer {ALICE}"}
    r = httpx2.delete(gone, headers=auth, timeout=30)
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert "page-beta" not in ids(url)
    assert httpx2.get(gone, headers=auth, timeout=30).status_code == 404
    assert "serve: deleted conversation page-beta" in tokened.stderr
