"""The fake model server over raw HTTP: wire format, faults, rules, log, remote control."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from chatstate.testing import FakeControl, FakeModel, reply_text

MESSAGES = [{"role": "user", "content": "hello fake"}]


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as server:
        yield server


@pytest.fixture
def http() -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=5) as client:
        yield client


def chat(http: httpx2.Client, fake: FakeModel, **body: Any) -> httpx2.Response:
    body.setdefault("model", "m")
    body.setdefault("messages", MESSAGES)
    return http.post(f"{fake.base_url}/chat/completions", json=body,
                     headers={"Authorization": "Bearer sk-canary-XYZ"})


def sse_events(response: httpx2.Response) -> list[str]:
    return [line[len("data: "):] for line in response.text.split("\n\n") if line]


def test_plain_completion_is_openai_shaped_and_deterministic(http: httpx2.Client,
                                                             fake: FakeModel) -> None:
    first = chat(http, fake).json()
    assert first["object"] == "chat.completion"
    assert first["model"] == "m"
    choice = first["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == reply_text(MESSAGES, 6) == fake.reply_for(MESSAGES)
    assert choice["message"]["content"].startswith("Echo: hello fake ")
    assert len(choice["message"]["content"].split()) == 3 + 6
    assert first["usage"] == {"prompt_tokens": 2, "completion_tokens": 9, "total_tokens": 11}
    again = chat(http, fake).json()["choices"][0]["message"]["content"]
    other = chat(http, fake, messages=[{"role": "user", "content": "hello fake"},
                                       {"role": "assistant", "content": "x"},
                                       {"role": "user", "content": "hello fake"}])
    assert again == choice["message"]["content"]
    assert other.json()["choices"][0]["message"]["content"] != again  # the history matters


@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_is_exact_openai_chunk_format(http: httpx2.Client, fake: FakeModel,
                                             include_usage: bool) -> None:
    response = chat(http, fake, stream=True, stream_options={"include_usage": include_usage})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    if include_usage:
        *chunks, last = chunks
        assert last["choices"] == []
        assert last["usage"]["completion_tokens"] == 9
        assert all(c["usage"] is None for c in chunks)
    else:
        assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": "stop"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == fake.reply_for(MESSAGES)


def test_models_endpoint(http: httpx2.Client, fake: FakeModel) -> None:
    models = http.get(f"{fake.base_url}/models").json()
    assert models["data"][0]["id"] == "fake-model"


def test_max_tokens_truncates_with_finish_reason_length(http: httpx2.Client,
                                                        fake: FakeModel) -> None:
    reply = chat(http, fake, max_tokens=2).json()["choices"][0]
    assert reply["finish_reason"] == "length"
    assert reply["message"]["content"] == "Echo: hello "


def test_fail_next_counts_down_and_sets_retry_after(http: httpx2.Client,
                                                    fake: FakeModel) -> None:
    fake.fail_next(429, times=2, retry_after=1.5)
    fake.fail_next(503, retry_after="Wed, 21 Oct 2015 07:28:00 GMT")
    first, second, third, fourth = (chat(http, fake) for _ in range(4))
    assert (first.status_code, second.status_code) == (429, 429)
    assert first.headers["retry-after"] == "1.5"
    assert first.json()["error"]["message"].startswith("Rate limit")
    assert third.status_code == 503
    assert third.headers["retry-after"].endswith("GMT")
    assert fourth.status_code == 200
    assert [e["behaviour"] for e in fake.request_log] == ["fail", "fail", "fail", "ok"]


def test_rules_match_the_last_user_message_until_reset(http: httpx2.Client,
                                                       fake: FakeModel) -> None:
    fake.add_rule(contains="FAIL-ME", status=500, message="boom")
    bad = [{"role": "user", "content": "row 7 FAIL-ME"}]
    assert chat(http, fake, messages=bad).status_code == 500
    assert chat(http, fake, messages=bad).json()["error"]["message"] == "boom"
    assert chat(http, fake).status_code == 200
    earlier = [{"role": "user", "content": "FAIL-ME"}, {"role": "user", "content": "fine"}]
    assert chat(http, fake, messages=earlier).status_code == 200
    fake.reset()
    assert chat(http, fake, messages=bad).status_code == 200
    assert len(fake.request_log) == 1


def test_request_log_records_presence_of_auth_never_its_value(http: httpx2.Client,
                                                              fake: FakeModel) -> None:
    chat(http, fake, stream=True, temperature=0.5)
    http.post(f"{fake.base_url}/chat/completions", json={"model": "m", "messages": MESSAGES})
    with_auth, without = fake.request_log
    assert with_auth["authorization"] is True
    assert without["authorization"] is False
    assert with_auth["stream"] is True
    assert with_auth["body"]["temperature"] == 0.5
    assert with_auth["messages"] == MESSAGES
    assert with_auth["status"] == 200
    assert isinstance(with_auth["time"], float)
    assert with_auth["time"] <= without["time"]
    assert "sk-canary" not in json.dumps(fake.request_log)


def test_cut_stream_drops_the_connection_mid_body(http: httpx2.Client,
                                                  fake: FakeModel) -> None:
    fake.cut_stream_next(after_chunks=2)
    seen: list[str] = []
    with pytest.raises(httpx2.RemoteProtocolError), http.stream(
            "POST", f"{fake.base_url}/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True}) as response:
        for line in response.iter_lines():
            seen.append(line)
    contents = [json.loads(s[6:])["choices"][0]["delta"].get("content") for s in seen if s]
    assert contents == ["", "Echo: ", "hello "]
    assert fake.request_log[0]["behaviour"] == "cut"
    assert chat(http, fake).status_code == 200  # the fault was used up


def test_clean_cut_ends_without_finish_or_done(http: httpx2.Client, fake: FakeModel) -> None:
    fake.cut_stream_next(after_chunks=3, clean=True)
    events = sse_events(chat(http, fake, stream=True))
    assert len(events) == 4
    assert "[DONE]" not in events
    assert all(json.loads(e)["choices"][0]["finish_reason"] is None for e in events)


def test_cut_plain_reply_sends_half_a_body(http: httpx2.Client, fake: FakeModel) -> None:
    fake.cut_stream_next()
    with pytest.raises(httpx2.RemoteProtocolError):
        chat(http, fake)


def test_hang_next_delays_then_answers(fake: FakeModel) -> None:
    fake.hang_next(0.6)
    with httpx2.Client(timeout=0.1) as impatient, pytest.raises(httpx2.ReadTimeout):
        chat(impatient, fake)
    fake.hang_next(0.2)
    with httpx2.Client(timeout=5) as patient:
        started = time.monotonic()
        assert chat(patient, fake).status_code == 200
        assert time.monotonic() - started >= 0.2


def test_malformed_next(http: httpx2.Client, fake: FakeModel) -> None:
    fake.malformed_next(times=2)
    with pytest.raises(json.JSONDecodeError):
        chat(http, fake).json()
    assert "{this is not json" in sse_events(chat(http, fake, stream=True))


def test_error_event_next_fails_in_band(http: httpx2.Client, fake: FakeModel) -> None:
    fake.error_event_next(after_chunks=2, message="overloaded (fake)")
    events = sse_events(chat(http, fake, stream=True))
    assert len(events) == 4  # the role chunk, two content chunks, the error
    assert json.loads(events[-1])["error"]["message"] == "overloaded (fake)"
    assert "[DONE]" not in events


@pytest.mark.parametrize(("path", "status", "shape"), [
    ("/chat/completions", 529, {"error": {"message": "Overloaded (fake)",
                                          "type": "server_error", "param": None,
                                          "code": "529"}}),
    ("/responses", 429, {"type": "error", "code": "rate_limit_exceeded",
                         "message": "Rate limit reached for requests (fake).", "param": None,
                         "sequence_number": 0}),
    ("/messages", 529, {"type": "error", "error": {"type": "overloaded_error",
                                                   "message": "Overloaded (fake)"}})])
def test_error_event_next_speaks_the_api_it_answers(http: httpx2.Client, fake: FakeModel,
                                                    path: str, status: int,
                                                    shape: dict[str, Any]) -> None:
    """One mid-stream error fault for every API, its event in that API's shape."""
    assert not hasattr(fake, "error_stream_next")
    fake.error_event_next(after_chunks=1, status=status)
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 50}
    body.update({"input": "hello fake"} if path == "/responses" else {"messages": MESSAGES})
    events = http.post(fake.base_url + path, json=body).text.strip().split("\n\n")
    name, _, data = events[-1].rpartition("data: ")
    assert json.loads(data) == shape
    assert name.strip() == ("" if path == "/chat/completions" else "event: error")
    assert "[DONE]" not in events and not any("completed" in e or "message_stop" in e
                                               for e in events)


def test_html_next_answers_a_page(http: httpx2.Client, fake: FakeModel) -> None:
    fake.html_next(times=2)
    for stream in (False, True):
        r = chat(http, fake, stream=stream)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert r.text.startswith("<!DOCTYPE html>")


def test_embeddings_completions_and_one_model(http: httpx2.Client, fake: FakeModel) -> None:
    emb = http.post(fake.base_url + "/embeddings", json={"model": "e", "input": ["a", "b"]})
    assert [d["index"] for d in emb.json()["data"]] == [0, 1]
    assert emb.json() == http.post(fake.base_url + "/embeddings",
                                   json={"model": "e", "input": ["a", "b"]}).json()
    done = http.post(fake.base_url + "/completions", json={"model": "m", "prompt": "hi"})
    assert done.json()["choices"][0]["text"] == "Completed: hi"
    streamed = http.post(fake.base_url + "/completions",
                         json={"model": "m", "prompt": "hi", "stream": True})
    events = sse_events(streamed)
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == "Completed: hi"
    assert http.get(fake.base_url + "/models/fake-model").json()["id"] == "fake-model"
    assert http.get(fake.base_url + "/models/other").status_code == 404
    assert [e["path"] for e in fake.request_log][-2:] == ["/v1/models/fake-model",
                                                          "/v1/models/other"]


def test_latency_and_chunk_delay(http: httpx2.Client, fake: FakeModel) -> None:
    fake.configure(latency=0.1, chunk_delay=0.02)
    started = time.monotonic()
    chat(http, fake, stream=True)
    assert time.monotonic() - started >= 0.1 + 0.02 * 9


def test_close_returns_promptly_while_a_request_hangs() -> None:
    fake = FakeModel().start()
    fake.hang_next(30)
    with httpx2.Client(timeout=0.2) as client, pytest.raises(httpx2.ReadTimeout):
        chat(client, fake)
    started = time.monotonic()
    fake.close()
    assert time.monotonic() - started < 10  # the hang is 30 s; margin for a loaded box


def test_binds_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FakeModel(host="0.0.0.0")


def test_bad_requests_get_openai_style_errors(http: httpx2.Client, fake: FakeModel) -> None:
    bad = http.post(f"{fake.base_url}/chat/completions", content=b"not json")
    assert bad.status_code == 400
    assert "error" in bad.json()
    assert http.get(f"{fake.url}/nowhere").status_code == 404
    refused = http.post(f"{fake.url}/_fake/control", json={"command": "explode", "args": {}})
    assert refused.status_code == 400


def test_remote_control_in_another_process() -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "chatstate.testing.fake_server", "--reply-words", "3"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:")
        assert base_url.endswith("/v1")
        control = FakeControl(base_url)
        control.fail_next(503, retry_after=2)
        control.add_rule(contains="FAIL-ME")
        with httpx2.Client(timeout=5) as http:
            url = f"{base_url}/chat/completions"
            assert http.post(url, json={"model": "m", "messages": MESSAGES}).status_code == 503
            ok = http.post(url, json={"model": "m", "messages": MESSAGES}).json()
        assert ok["choices"][0]["message"]["content"] == reply_text(MESSAGES, 3)
        assert [e["status"] for e in control.request_log] == [503, 200]
        assert control.state()["rules"][0]["contains"] == "FAIL-ME"
        control.reset()
        assert control.request_log == []
        with pytest.raises(ValueError, match="refused"):
            control.configure(colour="blue")
    finally:
        server.terminate()
        server.wait(timeout=5)


def test_scripted_tool_calls_in_the_openai_wire_shape(http: httpx2.Client,
                                                     fake: FakeModel) -> None:
    fake.add_tool_rule(contains="hello", text="On it. ", calls=[
        {"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": "not json"}])
    fake.configure(arg_chunk=1)
    plain = chat(http, fake).json()["choices"][0]
    assert plain["finish_reason"] == "tool_calls"
    message = plain["message"]
    assert message["content"] == "On it. "
    assert [(c["type"], c["function"]) for c in message["tool_calls"]] == [
        ("function", {"name": "f", "arguments": '{"a": 1}'}),
        ("function", {"name": "g", "arguments": "not json"})]
    chunks = [json.loads(e) for e in sse_events(chat(http, fake, stream=True))[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0] == {"index": 0, "id": message["tool_calls"][0]["id"], "type": "function",
                        "function": {"name": "f", "arguments": ""}}
    pieces = [c["function"]["arguments"] for c in calls if "id" not in c]
    assert all(len(p) == 1 for p in pieces)  # one character per chunk
    assert "".join(pieces) == '{"a": 1}' + "not json"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # once the calls are answered, the reply reads the results back
    answered = [*MESSAGES, message,
                {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "1"},
                {"role": "tool", "tool_call_id": message["tool_calls"][1]["id"], "content": "2"}]
    reply = chat(http, fake, messages=answered).json()["choices"][0]
    ids = [c["id"] for c in message["tool_calls"]]
    assert reply["message"]["content"] == f"Tool results: {ids[0]}=1; {ids[1]}=2"
    assert reply["finish_reason"] == "stop"
    assert "tool_calls" not in reply["message"]
    assert fake.state()["tool_rules"][0]["contains"] == "hello"


def test_tool_rules_over_http_and_written_calls() -> None:
    with FakeModel() as fake, httpx2.Client(timeout=5) as http:
        control = FakeControl(fake.base_url)
        control.add_tool_rule(contains="remote", calls=[{"name": "f", "arguments": {}}],
                              rounds=2)
        assert control.state()["tool_rules"][0]["rounds"] == 2
        url = f"{fake.base_url}/chat/completions"
        remote = http.post(url, json={"messages": [{"role": "user", "content": "remote"}]})
        assert remote.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"
        # no rule: a message writing NAME(JSON) calls that tool, if the request offers it
        offered = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
        asked = [{"role": "user", "content": 'please lookup({"q": "x"})'}]
        written = http.post(url, json={"messages": asked, "tools": offered}).json()
        assert written["choices"][0]["message"]["tool_calls"][0]["function"] == {
            "name": "lookup", "arguments": '{"q": "x"}'}
        plain = http.post(url, json={"messages": asked}).json()  # not offered: an echo
        assert plain["choices"][0]["message"]["content"].startswith("Echo: please lookup")
        control.reset()
        assert control.state()["tool_rules"] == []


def test_public_names_are_pinned() -> None:
    import chatstate.testing

    assert chatstate.testing.__all__ == [
        "Controls", "FakeControl", "FakeModel", "reply_text", "serve"]


def test_importing_the_fake_is_stdlib_only() -> None:
    code = ("import sys, chatstate; before = set(sys.modules); import chatstate.testing; "
            "new = set(sys.modules) - before; "
            "print(sorted(m for m in ('openai', 'httpx2', 'pydantic') if m in new))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
