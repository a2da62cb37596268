"""The Responses and Anthropic Messages dialects, against the fake model over real HTTP.

Each dialect goes through the one retry loop: plain and streamed replies, cut
replies (``max_tokens`` / ``max_output_tokens``) stored as finish_reason
"length", tool calls, retries of 429/529 and of streams cut mid-way, context
overflows, and the provider parts that must round-trip (Anthropic thinking
blocks with signatures, Responses reasoning items with encrypted_content: the
fake refuses any that come back changed). Chat and the tool loop run unchanged
on each, and a conversation continues through another dialect with one stored form.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatstate import Chat, make_adapter, tool
from chatstate.adapter import Completion
from chatstate.errors import ModelError
from chatstate.testing import FakeModel

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")

APIS = ("responses", "anthropic_messages")
THINK = {"responses": {"reasoning": {"effort": "low"},
                       "include": ["reasoning.encrypted_content"]},
         "anthropic_messages": {"thinking": {"type": "enabled", "budget_tokens": 1024}}}
KEPT = {"responses": "reasoning_items", "anthropic_messages": "thinking_blocks"}
PATH = {"responses": "/v1/responses", "anthropic_messages": "/v1/messages"}


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as server:
        yield server


def adapter_for(fake: FakeModel, api: str, **kwargs: Any) -> Any:
    return make_adapter(base_url=fake.base_url, api=api, api_key="sk-test-dialects",
                        model="fake-model", max_retries=3, backoff_base=0.001, **kwargs)


# -- the fake speaks both APIs in their own shapes ------------------------------------------


def _sse(client: httpx2.Client, url: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    with client.stream("POST", url, json=body) as response:
        return [(e.event, e.data) for e in httpx2.EventSource(response)]


def test_the_fake_streams_responses_events_with_sequence_and_output_index(
        fake: FakeModel) -> None:
    import json

    with httpx2.Client() as client:
        events = _sse(client, fake.base_url + "/responses",
                      {"model": "m", "input": "hello", "stream": True, **THINK["responses"]})
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    assert "response.reasoning_summary_text.delta" in names
    payloads = [json.loads(data) for _, data in events]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    for p in payloads:
        assert p["type"] == names[payloads.index(p)]
        if p["type"].startswith(("response.output_", "response.content_part",
                                 "response.function_call")):
            assert isinstance(p["output_index"], int)


def test_the_fake_streams_anthropic_events_and_answers_errors_in_anthropic_shape(
        fake: FakeModel) -> None:
    import json

    with httpx2.Client() as client:
        events = _sse(client, fake.base_url + "/messages",
                      {"model": "m", "max_tokens": 100, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}], **THINK[
                           "anthropic_messages"]})
        names = [n for n, _ in events]
        assert names[0] == "message_start" and "ping" in names and names[-1] == "message_stop"
        deltas = [json.loads(d)["delta"]["type"] for n, d in events if n == "content_block_delta"]
        assert deltas[:2] == ["thinking_delta", "signature_delta"]
        fake.fail_next(529)
        overloaded = client.post(fake.base_url + "/messages", json={
            "model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
        assert overloaded.status_code == 529
        assert overloaded.json()["error"]["type"] == "overloaded_error"
        forged = client.post(fake.base_url + "/messages", json={
            "model": "m", "max_tokens": 5, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "x", "signature": "forged"},
                    {"type": "text", "text": "hello"}]},
                {"role": "user", "content": "again"}]})
        assert forged.status_code == 400 and "signature" in forged.json()["error"]["message"]


# -- the adapter speaks both -----------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_plain_and_streamed_replies_usage_and_a_cut_reply(fake: FakeModel, api: str) -> None:
    adapter = adapter_for(fake, api)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    done = adapter.complete(messages)
    assert done.text.startswith("Echo: hi") and done.finish_reason == "stop"
    assert done.usage and done.usage["completion_tokens"] == len(done.text.split())
    items = list(adapter.stream(messages, params={"max_tokens": 3}))
    final = items[-1]
    assert isinstance(final, Completion) and final.finish_reason == "length"
    assert "".join(i for i in items if isinstance(i, str)) == final.text == "Echo: hi " + \
        done.text.split()[2] + " "
    sent = fake.request_log[-1]
    assert sent["path"].startswith(PATH[api])
    if api == "anthropic_messages":
        assert sent["body"]["system"] == "be brief" and sent["body"]["max_tokens"] == 3
    else:
        assert sent["body"]["max_output_tokens"] == 3


@pytest.mark.parametrize("api", APIS)
def test_rate_limits_overload_and_cut_streams_are_retried_under_the_one_loop(
        fake: FakeModel, api: str) -> None:
    adapter = adapter_for(fake, api)
    messages = [{"role": "user", "content": "retry me"}]
    expected = adapter.complete(messages).text
    fake.fail_next(429, retry_after=0)
    fake.fail_next(529 if api == "anthropic_messages" else 503)
    assert adapter.complete(messages).text == expected
    fake.cut_stream_next(after_chunks=2)
    pieces = [i for i in adapter.stream(messages) if isinstance(i, str)]
    assert "".join(pieces) == expected  # the retried stream's prefix was swallowed
    fake.cut_stream_next(after_chunks=2, clean=True)  # a body that ends without a stop
    assert list(adapter.stream(messages))[-1].text == expected
    statuses = [e["status"] for e in fake.request_log]
    assert statuses.count(200) >= 5


@pytest.mark.parametrize("api", APIS)
def test_a_prompt_past_the_window_is_a_context_overflow(fake: FakeModel, api: str) -> None:
    fake.configure(context_window=5)
    adapter = adapter_for(fake, api)
    with pytest.raises(ModelError) as caught:
        adapter.complete([{"role": "user", "content": "one two three four five six seven"}])
    assert caught.value.retryable is False
    assert "7" in str(caught.value) and "5" in str(caught.value)


@pytest.mark.parametrize("api", APIS)
def test_images_and_files_go_as_the_apis_own_parts(fake: FakeModel, api: str) -> None:
    png = base64.b64encode(b"\x89PNG fake image").decode()
    pdf = base64.b64encode(b"%PDF-1.4 fake").decode()
    adapter = adapter_for(fake, api)
    adapter.complete([{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{pdf}",
                                  "filename": "a.pdf"}}]}])
    entry = fake.request_log[-1]
    sent = entry["body"]["input"][0]["content"] if api == "responses" else \
        entry["body"]["messages"][0]["content"]
    kinds = [p["type"] for p in sent]
    assert kinds == (["input_text", "input_image", "input_file"] if api == "responses"
                     else ["text", "image", "document"])
    received = {p["type"]: p for p in entry["parts"]}
    assert received["image_url"]["size"] == len(b"\x89PNG fake image")
    assert received["file"]["media_type"] == "application/pdf"


@pytest.mark.parametrize("api", APIS)
def test_the_setting_and_the_url_pick_the_dialect(fake: FakeModel, api: str,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHATSTATE_API", api)
    by_env = make_adapter(base_url=fake.base_url, api_key="k", model="m")
    assert by_env.dialect.name == api
    monkeypatch.delenv("CHATSTATE_API")
    by_url = make_adapter(base_url=fake.base_url + PATH[api].removeprefix("/v1"),
                          api_key="k", model="m")
    assert by_url.dialect.name == api
    by_url.complete([{"role": "user", "content": "x"}])
    assert fake.request_log[-1]["path"].split("?")[0] == PATH[api]
    if api == "anthropic_messages":
        assert fake.request_log[-1]["authorization"]  # as x-api-key


# -- Chat, the tool loop and one stored form -----------------------------------------------


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("api", APIS)
def test_chat_and_the_tool_loop_round_trip_signed_reasoning_unchanged(
        fake: FakeModel, api: str, streamed: bool, tmp_path: Path) -> None:
    fake.add_tool_rule(contains="weather", calls=[
        {"name": "get_weather", "arguments": {"city": "Paris"}}])
    url = f"sqlite:///{tmp_path}/c.db"
    chat = Chat(url, adapter=adapter_for(fake, api), params=THINK[api])
    if streamed:
        text = "".join(chat.stream("what is the weather?", tools=[get_weather]))
    else:
        text = chat.send("what is the weather?", tools=[get_weather]).text or ""
    assert text.startswith("Tool results: ") and "sunny in Paris" in text
    calling = next(m for m in chat.conversation.messages if m.tool_calls)
    kept = (calling.extra or {})[KEPT[api]]
    assert kept, "the reasoning of the tool-calling reply is stored with it"
    # the second request sent the stored reasoning back exactly as it came
    second = fake.request_log[-1]["body"]
    if api == "anthropic_messages":
        assistant = next(m for m in second["messages"] if m["role"] == "assistant")
        assert assistant["content"][0] == kept[0]
    else:
        assert kept[0] in second["input"]
    assert all(e["status"] == 200 for e in fake.request_log)  # no signature was refused
    chat.send("and now?")
    assert chat.conversation.verify() is None
    again = Chat(url, conversation_id=chat.id, adapter=adapter_for(fake, api))
    assert [m.role for m in again.conversation.messages] == \
        [m.role for m in chat.conversation.messages]


@pytest.mark.parametrize("first, then", [("anthropic_messages", "chat_completions"),
                                         ("responses", "anthropic_messages"),
                                         ("chat_completions", "responses")])
def test_a_conversation_continues_through_another_dialect(
        fake: FakeModel, first: str, then: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    params = THINK.get(first, {})
    chat = Chat(url, adapter=adapter_for(fake, first), params=params)
    chat.send("first question")
    stored = chat.conversation.messages[-1]
    caplog.set_level(logging.INFO, logger="chatstate.adapter")
    other = Chat(url, conversation_id=chat.id, adapter=adapter_for(fake, then))
    reply = other.send("second question")
    assert reply.text and reply.text.startswith("Echo: second question")
    seen = fake.request_log[-1]["messages"]
    assert [m["role"] for m in seen] == ["user", "assistant", "user"]
    assert seen[1]["content"] == stored.text
    if first in KEPT:  # what the other API cannot express was left out, and said so
        assert f"left out of this {then} request" in caplog.text
        assert KEPT[first].replace("_", " ").split()[0] in caplog.text
        assert (stored.extra or {})[KEPT[first]]
    final = Chat(url, conversation_id=chat.id, adapter=adapter_for(fake, then))
    assert final.conversation.messages[1].extra == stored.extra  # never lost from the store
    assert final.conversation.verify() is None


@pytest.mark.parametrize("api", ("chat_completions", *APIS))
def test_an_overload_reported_mid_stream_is_retried_without_repeating_text(
        fake: FakeModel, api: str) -> None:
    adapter = adapter_for(fake, api)
    messages = [{"role": "user", "content": "overload me midway"}]
    expected = adapter.complete(messages).text
    fake.error_event_next(after_chunks=2, status=529)
    items = list(adapter.stream(messages))
    assert "".join(i for i in items if isinstance(i, str)) == expected == items[-1].text
    assert len(fake.request_log) == 3  # the plain one, the overloaded stream, its retry
    fake.error_event_next(after_chunks=1, status=529, times=9)
    with pytest.raises(ModelError, match="Overloaded"):
        list(adapter.stream(messages))


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_a_responses_reply_cut_but_called_completed_is_stored_as_cut(
        fake: FakeModel, streamed: bool, tmp_path: Path) -> None:
    """llama.cpp answers a reply cut by max_output_tokens with status "completed": the output
    tokens reaching the requested limit are what say it was cut, and Chat stores it so."""
    fake.configure(responses_cut_status="completed")
    chat = Chat(f"sqlite:///{tmp_path}/c.db", base_url=fake.base_url, api="responses",
                api_key="sk-test-dialects", model="fake-model", params={"max_tokens": 3})
    if streamed:
        text = "".join(chat.stream("tell me more"))
    else:
        text = chat.send("tell me more").text or ""
    sent = fake.request_log[-1]
    assert sent["path"].startswith("/v1/responses") and sent["body"]["max_output_tokens"] == 3
    assert len(text.split()) == 3
    reply = chat.conversation.messages[-1]
    assert reply.finish_reason == "length" and reply.text == text
    # a whole reply within the limit is not called cut
    whole = Chat(f"sqlite:///{tmp_path}/c.db", base_url=fake.base_url, api="responses",
                 api_key="sk-test-dialects", model="fake-model", params={"max_tokens": 100})
    whole.send("short")
    assert whole.conversation.messages[-1].finish_reason in (None, "stop")
