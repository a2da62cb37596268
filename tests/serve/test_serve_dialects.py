"""``chatstate serve`` answering the Responses and Anthropic Messages APIs, driven by the
real SDKs (the openai SDK in the dev venv; the anthropic SDK in a cached venv of its
own) against a real serve process in front of the fake model.

Each request's messages are stored before they go upstream and the reply before the
client sees it; a tool round continues the one conversation; the Responses stream
relayed is complete to the spec (every item event has ``output_index``); Anthropic
clients authenticate with ``x-api-key``; errors come back in each API's shape.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from support.agents_serve import AGENTS_SCRIPT
from support.serve_helpers import ServeProcess, serve_env
from support.venvs import cached_venv

from chatstate.stores import open_store
from chatstate.testing import FakeModel

TOKEN = "tok-dialects-0123456789abcdef0123456789"
TOOLS = [{"type": "function", "name": "get_weather", "description": "weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]
ANTHROPIC = ["anthropic==2.16.0"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FakeModel, ServeProcess, str]]:
    url = f"sqlite://{tmp_path}/s.db"
    with FakeModel(reply_words=4) as fake, \
            ServeProcess(url, fake.base_url, serve_env(tmp_path), "--token", TOKEN) as proxy:
        fake.add_tool_rule(contains="weather", calls=[
            {"name": "get_weather", "arguments": {"city": "Paris"}}])
        yield fake, proxy, url


def conversations(url: str) -> list[Any]:
    store = open_store(url)
    try:
        return [store.load(s.id) for s in store.list_conversations()]
    finally:
        store.close()


def test_openai_sdk_responses_create_with_a_tool_round_is_one_stored_conversation(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    fake, proxy, url = served
    client = openai.OpenAI(base_url=proxy.base_url, api_key=TOKEN, max_retries=0)
    first = client.responses.create(model="fake-model", instructions="be brief",
                                    input="what is the weather?", tools=TOOLS,
                                    reasoning={"effort": "low"},
                                    include=["reasoning.encrypted_content"])
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    history: list[Any] = [{"role": "user", "content": "what is the weather?"}]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": calls[0].call_id,
                    "output": "sunny"})
    second = client.responses.create(model="fake-model", instructions="be brief",
                                     input=history, tools=TOOLS)
    assert second.output_text == f"Tool results: {calls[0].call_id}=sunny"
    # the reasoning item went back upstream as it came (the fake verifies its signature)
    assert all(e["status"] == 200 for e in fake.request_log)
    convs = conversations(url)
    assert len(convs) == 1, [c.id for c in convs]
    messages = convs[0].messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2].tool_calls and messages[2].extra["reasoning_items"][0]["encrypted_content"]
    assert messages[-1].text == second.output_text
    assert convs[0].verify() is None


def test_openai_sdk_responses_stream_is_spec_complete_and_stored_before_relayed(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    fake, proxy, url = served
    client = openai.OpenAI(base_url=proxy.base_url, api_key=TOKEN, max_retries=0)
    seen: list[Any] = []
    with client.responses.stream(model="fake-model", input="hello stream",
                                 max_output_tokens=3) as stream:
        for event in stream:
            seen.append(event)
    final = seen[-1]  # the SDK's get_final_response wants response.completed; a cut one
    assert final.type == "response.incomplete"  # ends response.incomplete, as OpenAI's
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert text == final.response.output_text and final.response.status == "incomplete"
    with client.responses.stream(model="fake-model", input="whole stream") as stream:
        whole = stream.get_final_response()
    assert whole.status == "completed" and whole.output_text.startswith("Echo: whole stream")
    assert all(isinstance(getattr(e, "output_index", 0), int) for e in seen)
    assert [e.sequence_number for e in seen] == sorted(e.sequence_number for e in seen)
    stored = {c.messages[0].text: c.messages[-1] for c in conversations(url)}
    assert stored["hello stream"].text == text
    assert stored["hello stream"].finish_reason == "length"
    assert stored["whole stream"].text == whole.output_text
    # an error upstream comes back OpenAI-shaped, and the turn says why it has no reply
    fake.fail_next(400, message="bad thing (fake)")
    with pytest.raises(openai.BadRequestError, match="bad thing"):
        client.responses.create(model="fake-model", input="fails")


def test_a_streamed_responses_request_sent_again_streams_its_stored_reply_once(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    # the SDK's retry of the same request is answered from the store (a replay): its
    # events must build the same snapshot as the upstream's did, text and tool call alike
    fake, proxy, _url = served
    client = openai.OpenAI(base_url=proxy.base_url, api_key=TOKEN, max_retries=0)
    for ask in ({"input": "replay me"}, {"input": "what is the weather?", "tools": TOOLS}):
        runs = []
        for _ in range(2):
            with client.responses.stream(model="fake-model", **ask) as stream:
                snapshots = [e.snapshot for e in stream
                             if e.type == "response.output_text.delta"]
                final = stream.get_final_response()
            runs.append((snapshots[-1:], final.output_text,
                         [(i.type, getattr(i, "arguments", None)) for i in final.output]))
        assert len(fake.request_log) == (1 if "tools" not in ask else 2), "not a replay"
        assert runs[1] == runs[0], ask
        if "tools" not in ask:
            assert runs[0][0] == [runs[0][1]]  # the snapshot is the text, once
        else:
            assert runs[0][2] == [("function_call", '{"city": "Paris"}')]


def test_the_responses_relay_fills_in_output_index_an_upstream_left_out(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    from chatstate.serve._responses import complete_events

    rewrite = complete_events()
    added = rewrite("response.output_item.added", {
        "type": "response.output_item.added", "item": {"type": "message", "id": "m1"}})
    delta = rewrite(None, {"type": "response.output_text.delta", "item_id": "m1",
                           "delta": "x"})
    assert added["output_index"] == 0 and delta["output_index"] == 0
    assert (added["sequence_number"], delta["sequence_number"]) == (0, 1)
    assert delta["content_index"] == 0


ANTHROPIC_SCRIPT = r"""
import json, sys
import anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
tools = [{"name": "get_weather", "description": "weather",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
thinking = {"type": "enabled", "budget_tokens": 1024}
ask = [{"role": "user", "content": "what is the weather?"}]
first = client.messages.create(model="fake-model", max_tokens=200, system="be brief",
                               messages=ask, tools=tools, thinking=thinking)
use = next(b for b in first.content if b.type == "tool_use")
history = ask + [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                   for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "sunny"}]}]
second = client.messages.create(model="fake-model", max_tokens=200, system="be brief",
                                messages=history, tools=tools, thinking=thinking)
with client.messages.stream(model="fake-model", max_tokens=3,
                            messages=[{"role": "user", "content": "stream me"}]) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
try:
    client.messages.create(model="fake-model", max_tokens=5,
                           messages=[{"role": "user", "content": "overload"}])
    overloaded = None
except anthropic.APIStatusError as exc:
    overloaded = [exc.status_code, exc.body["error"]["type"]]
print(json.dumps({"first": first.stop_reason, "use": use.id, "second": second.content[-1].text,
                  "thinking": first.content[0].type, "streamed": streamed,
                  "final": final.stop_reason, "overloaded": overloaded,
                  "version": anthropic.__version__}))
"""


def test_anthropic_sdk_messages_create_and_stream_with_a_tool_round(
        served: tuple[FakeModel, ServeProcess, str], tmp_path: Path) -> None:
    fake, proxy, url = served
    bin_dir = cached_venv("anthropic", ANTHROPIC, tier="anthropic client")
    fake.add_rule(contains="overload", status=529)
    proc = subprocess.run([str(bin_dir / "python"), "-c", ANTHROPIC_SCRIPT, proxy.root, TOKEN],
                          capture_output=True, text=True, timeout=120, check=False,
                          env=serve_env(tmp_path))
    assert proc.returncode == 0, proc.stderr + proxy.stderr
    out = json.loads(proc.stdout)
    assert out["first"] == "tool_use" and out["thinking"] == "thinking"
    assert out["second"] == f"Tool results: {out['use']}=sunny"
    assert out["final"] == "max_tokens" and out["streamed"].startswith("Echo: stream")
    assert out["overloaded"] == [529, "overloaded_error"]
    assert all(e["status"] == 200 for e in fake.request_log
               if "overload" not in json.dumps(e["messages"]))  # signatures went back intact
    convs = {c.messages[1].text if c.messages[0].role == "system" else c.messages[0].text: c
             for c in conversations(url)}
    tool_conv = convs["what is the weather?"]
    assert [m.role for m in tool_conv.messages] == ["system", "user", "assistant", "tool",
                                                    "assistant"]
    kept = tool_conv.messages[2].extra["thinking_blocks"][0]
    assert kept["type"] == "thinking" and kept["signature"]
    cut = convs["stream me"].messages[-1]
    assert cut.finish_reason == "length" and cut.text == out["streamed"]
    assert all(c.verify() is None for c in convs.values())


def test_anthropic_blocks_chatstate_has_no_part_for_are_stored_as_sent(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    # a plain-text document was stored as an empty file_data, an image by file id as an
    # empty url, and an image a tool returned was dropped from its result
    _, proxy, url = served
    document = {"type": "document", "title": "contract.txt", "source": {
        "type": "text", "media_type": "text/plain", "data": "The fee is 42 EUR."}}
    by_id = {"type": "image", "source": {"type": "file", "file_id": "file_011abc"}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    messages = [
        {"role": "user", "content": "what does the chart show?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "chart", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "chart:"}, image]},
            document, by_id, {"type": "text", "text": "and the contract?"}]}]
    sent = httpx2.post(proxy.base_url + "/messages", timeout=30, json={
        "model": "m", "max_tokens": 20, "messages": messages},
        headers={"x-api-key": TOKEN, "anthropic-version": "2023-06-01"})
    assert sent.status_code == 200, sent.text
    [conv] = [c for c in conversations(url) if c.messages[0].text == "what does the chart show?"]
    tool = next(m for m in conv.messages if m.role == "tool")
    assert tool.content == [{"type": "text", "text": "chart:"},
                            {"type": "image_url", "image_url": {
                                "url": "data:image/png;base64,iVBORw0KGgo="}}]
    user = [m for m in conv.messages if m.role == "user"][-1]
    assert user.content == [document, by_id, {"type": "text", "text": "and the contract?"}]


def test_x_api_key_is_the_token_and_errors_are_anthropic_shaped(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    _, proxy, _ = served
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    ok = httpx2.post(proxy.base_url + "/messages", json=body,
                     headers={"x-api-key": TOKEN, "anthropic-version": "2023-06-01"})
    assert ok.status_code == 200 and ok.json()["type"] == "message"
    wrong = httpx2.post(proxy.base_url + "/messages", json=body, headers={"x-api-key": "no"})
    assert wrong.status_code == 401
    bad = httpx2.post(proxy.base_url + "/messages", json={"model": "m", "messages": []},
                      headers={"x-api-key": TOKEN})
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"


def test_the_proxys_own_refusals_on_messages_routes_are_anthropic_shaped(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    # 401, 415, 413, the no-log 400 and an unknown route were OpenAI-shaped on /v1/messages
    # (the anthropic SDK then reads no message); the chat routes keep OpenAI's shape
    _, proxy, _ = served
    base, auth = proxy.base_url, {"x-api-key": TOKEN, "anthropic-version": "2023-06-01"}
    body = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    answers = {
        401: httpx2.post(base + "/messages", json=body, headers={"x-api-key": "no"}),
        415: httpx2.post(base + "/messages", content=b"hi", headers={
            **auth, "content-type": "text/plain"}),
        400: httpx2.post(base + "/messages", json=body, headers={
            **auth, "X-Chatstate-No-Log": "1"}),
        404: httpx2.post(base + "/messages/nothing_here", json=body, headers=auth),
    }
    for status, answer in answers.items():
        assert answer.status_code == status, (status, answer.text)
        shaped = answer.json()
        assert shaped["type"] == "error" and shaped["error"]["message"], (status, shaped)
    chat = httpx2.post(base + "/chat/completions", json=body, headers={"x-api-key": "no"})
    assert chat.status_code == 401 and "type" not in chat.json()  # OpenAI's, as before


def test_count_tokens_goes_upstream_unstored(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    # it was a 404 through serve; Claude Code and the anthropic SDK call it
    fake, proxy, url = served
    before = len(conversations(url))
    counted = httpx2.post(proxy.base_url + "/messages/count_tokens", headers={
        "x-api-key": TOKEN, "anthropic-version": "2023-06-01"}, json={
        "model": "m", "system": "be brief",
        "messages": [{"role": "user", "content": "count these four words"}]})
    assert counted.status_code == 200, counted.text
    assert counted.json() == {"input_tokens": 6}
    assert fake.request_log[-1]["path"].endswith("/messages/count_tokens")
    assert len(conversations(url)) == before


def test_previous_response_id_is_answered_from_the_store_for_a_stateless_upstream(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    fake, proxy, url = served
    client = openai.OpenAI(base_url=proxy.base_url, api_key=TOKEN, max_retries=0)
    first = client.responses.create(model="fake-model", input="what is the weather?",
                                    tools=TOOLS)
    call = next(item for item in first.output if item.type == "function_call")
    second = client.responses.create(
        model="fake-model", previous_response_id=first.id, tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == f"Tool results: {call.call_id}=sunny"
    third = client.responses.create(model="fake-model", previous_response_id=second.id,
                                    input="and tomorrow?")
    assert third.output_text.startswith("Echo: and tomorrow?")
    # the fake refuses previous_response_id (as llama.cpp does): it got the whole history
    assert all("previous_response_id" not in e["body"] for e in fake.request_log)
    assert [m["role"] for m in fake.request_log[-1]["messages"]] == [
        "user", "assistant", "tool", "assistant", "user"]
    [conv] = conversations(url)  # one conversation, continued
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant",
                                               "user", "assistant"]
    got = client.responses.retrieve(second.id)
    assert got.id == second.id and got.output_text == second.output_text
    items = client.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["message", "function_call", "function_call_output"]
    with pytest.raises(openai.NotFoundError, match="resp_nope"):
        client.responses.create(model="fake-model", previous_response_id="resp_nope",
                                input="x")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")


def test_a_previous_responses_instructions_are_not_carried_over(
        served: tuple[FakeModel, ServeProcess, str]) -> None:
    # OpenAI: "the instructions from a previous response will not be carried over"; the
    # stored system message went upstream again as an input item
    fake, proxy, url = served
    client = openai.OpenAI(base_url=proxy.base_url, api_key=TOKEN, max_retries=0)
    first = client.responses.create(model="fake-model", instructions="Answer in French.",
                                    input="hello there")
    client.responses.create(model="fake-model", previous_response_id=first.id,
                            input="now in English")
    sent = fake.request_log[-1]["messages"][0]
    assert (sent["role"], sent["content"]) == ("user", "hello there")
    again = client.responses.create(model="fake-model", previous_response_id=first.id,
                                    instructions="Answer in French.", input="encore")
    assert fake.request_log[-1]["messages"][0] == {"role": "system",
                                                   "content": "Answer in French."}
    # given again each turn (as the Agents SDK does), the conversation goes on as one
    convs = [c for c in conversations(url) if any(m.text == "hello there" for m in c.messages)]
    went_on = [c for c in convs if any(m.text == "encore" for m in c.messages)]
    assert len(went_on) == 1 and went_on[0].messages[0].text == "Answer in French."
    assert went_on[0].messages[-1].text == again.output_text


def test_agents_sdk_default_responses_model_with_a_tool_and_two_turns(
        served: tuple[FakeModel, ServeProcess, str], tmp_path: Path) -> None:
    import sys

    fake, proxy, url = served
    proc = subprocess.run([sys.executable, "-c", AGENTS_SCRIPT, proxy.base_url, TOKEN, "run"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env=serve_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:] + proxy.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["first"].startswith("Tool results: ") and out["first"].endswith("sunny in Paris")
    assert out["second"].startswith("Echo: and tomorrow?")
    assert all(e["path"] == "/v1/responses" for e in fake.request_log)
    [conv] = conversations(url)  # three requests, one conversation
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool",
                                               "assistant", "user", "assistant"]
    assert conv.messages[-1].text == out["second"] and conv.verify() is None


def _deltas(api: str, line: str) -> str:
    """The reply text an SSE data line of ``api`` carries ("" for none)."""
    if not line.startswith("data: {"):
        return ""
    event = json.loads(line[6:])
    if api == "responses" and event.get("type") == "response.output_text.delta":
        return str(event["delta"])
    if api == "messages" and event.get("type") == "content_block_delta" and \
            event["delta"].get("type") == "text_delta":
        return str(event["delta"]["text"])
    return ""


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_kill_9_mid_stream_loses_nothing_the_client_received(tmp_path: Path, api: str) -> None:
    import threading
    import time

    url = f"sqlite://{tmp_path}/s.db"
    env = serve_env(tmp_path)
    with FakeModel(reply_words=80, chunk_delay=0.02) as fake:
        proxy = ServeProcess(url, fake.base_url, env)
        body: dict[str, Any] = {"model": "m", "stream": True, "input": "tell me a story"} \
            if api == "responses" else {"model": "m", "stream": True, "max_tokens": 500,
                                        "messages": [{"role": "user",
                                                      "content": "tell me a story"}]}
        received: list[str] = []
        started = threading.Event()

        def client() -> None:
            try:
                with httpx2.stream("POST", f"{proxy.base_url}/{api}", json=body, timeout=30,
                                   headers={"X-Chatstate-Conversation": "story"}) as resp:
                    for line in resp.iter_lines():
                        text = _deltas(api, line)
                        if text:
                            received.append(text)
                            started.set()
            except httpx2.HTTPError:
                pass

        thread = threading.Thread(target=client)
        thread.start()
        assert started.wait(20)
        time.sleep(0.3)
        proxy.kill()
        thread.join(30)
    store = open_store(url)
    try:
        conv = store.load("story")
    finally:
        store.close()
    kept = conv.partial or conv.messages[-1]
    assert received and kept.text.startswith("".join(received))  # 0 lost
    assert conv.verify() is None
