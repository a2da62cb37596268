"""The openai-SDK backend (a caller's ``client=``) speaking OpenAI Responses, against the
fake model over real HTTP: plain and streamed, through Chat and the tool loop, with
reasoning items sent back unchanged, a cut reply, and a retried 5xx under the one retry
loop (the SDK's own retries are off). Anthropic Messages has no SDK backend: asking for
it with ``client=`` is refused with a message that names the fix."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from chatstate import Chat, make_adapter, tool
from chatstate.adapter import Completion
from chatstate.testing import FakeModel

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")

THINK = {"reasoning": {"effort": "low"}, "include": ["reasoning.encrypted_content"]}


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as server:
        server.add_tool_rule(contains="weather", calls=[
            {"name": "get_weather", "arguments": {"city": "Paris"}}])
        yield server


def sdk_adapter(fake: FakeModel) -> Any:
    client = openai.OpenAI(base_url=fake.base_url, api_key="sk-test-sdk-dialects")
    return make_adapter(client=client, api="responses", model="fake-model", max_retries=3,
                        backoff_base=0.001)


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def same(done: Any) -> Any:
    """A Completion but for its response id (each reply has its own)."""
    assert isinstance(done, Completion) and (done.extra or {}).get("response_id")
    return dataclasses.replace(done, extra={k: v for k, v in (done.extra or {}).items()
                                            if k != "response_id"})


def test_the_sdk_backend_reads_responses_as_the_wire_backend_does(fake: FakeModel) -> None:
    """Plain, streamed and cut: the same request through the caller's client and through
    the built-in backend gives the same reply, text, usage and finish reason alike."""
    sdk = sdk_adapter(fake)
    wire = make_adapter(base_url=fake.base_url, api="responses", api_key="sk-test-sdk-dialects",
                        model="fake-model")
    assert sdk.backend.endpoint == wire.backend.endpoint == fake.base_url + "/responses"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    for params in ({}, {"max_tokens": 3}):
        plain = [a.complete(messages, params=params) for a in (sdk, wire)]
        streamed = [list(a.stream(messages, params=params)) for a in (sdk, wire)]
        assert same(plain[0]) == same(plain[1])
        assert [*streamed[0][:-1], same(streamed[0][-1])] == \
            [*streamed[1][:-1], same(streamed[1][-1])]
        final = streamed[0][-1]
        assert isinstance(final, Completion) and final.text == plain[0].text
        assert "".join(i for i in streamed[0] if isinstance(i, str)) == final.text
        assert final.finish_reason == plain[0].finish_reason == \
            ("length" if params else "stop")
        assert final.usage and final.usage["completion_tokens"] == len(final.text.split())
    assert {e["path"] for e in fake.request_log} == {"/v1/responses"}
    assert [bool(e["body"].get("stream")) for e in fake.request_log] == \
        [False, False, True, True] * 2
    wire.close()


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_chat_and_the_tool_loop_over_the_sdk_responses_backend(
        fake: FakeModel, streamed: bool, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    chat = Chat(url, adapter=sdk_adapter(fake), params=THINK)
    if streamed:
        text = "".join(chat.stream("what is the weather?", tools=[get_weather]))
    else:
        text = chat.send("what is the weather?", tools=[get_weather]).text or ""
    assert text.startswith("Tool results: ") and "sunny in Paris" in text
    messages = chat.conversation.messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    calling = messages[1]
    assert calling.tool_calls and calling.tool_calls[0]["function"]["name"] == "get_weather"
    kept = (calling.extra or {})["reasoning_items"]
    assert kept[0]["encrypted_content"]
    second = fake.request_log[-1]["body"]
    assert kept[0] in second["input"]  # sent back exactly as it came (the fake verifies it)
    outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert outputs == [{"type": "function_call_output",
                        "call_id": calling.tool_calls[0]["id"], "output": "sunny in Paris"}]
    assert second["include"] == ["reasoning.encrypted_content"]
    assert all(e["status"] == 200 and e["path"] == "/v1/responses" for e in fake.request_log)
    assert chat.conversation.verify() is None


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_a_5xx_is_retried_by_the_one_loop_not_the_sdk(fake: FakeModel, streamed: bool) -> None:
    adapter = sdk_adapter(fake)
    fake.fail_next(503, times=2)
    messages = [{"role": "user", "content": "again"}]
    final = list(adapter.stream(messages))[-1] if streamed else adapter.complete(messages)
    assert isinstance(final, Completion) and final.text.startswith("Echo: again")
    assert [e["status"] for e in fake.request_log] == [503, 503, 200]


def test_anthropic_messages_with_a_client_is_refused_naming_the_fix(fake: FakeModel,
                                                                    tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=fake.base_url, api_key="sk-test-sdk-dialects")
    fix = r"'anthropic_messages' api.*no backend for another SDK: drop client= and pass " \
          r"base_url= and api_key= with api='anthropic_messages'"
    with pytest.raises(ValueError, match=fix):
        make_adapter(client=client, api="anthropic_messages")
    with pytest.raises(ValueError, match=fix):
        Chat(f"sqlite:///{tmp_path}/c.db", client=client, api="anthropic")
    assert fake.request_log == []  # refused before anything was sent
    # the fix it names works: the built-in backend speaks Anthropic Messages
    chat = Chat(f"sqlite:///{tmp_path}/c.db", base_url=fake.base_url,
                api_key="sk-test-sdk-dialects", api="anthropic_messages", model="fake-model")
    assert (chat.send("hello").text or "").startswith("Echo: hello")
    assert fake.request_log[-1]["path"] == "/v1/messages"
