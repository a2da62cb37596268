"""The model adapter against the real fake server over loopback HTTP.

One conformance suite runs every behaviour through both backends (the httpx2
wire client and the openai SDK client); nothing is mocked. Retry waits are
kept tiny with ``backoff_base``; Retry-After waits are asserted from the
server's own arrival timestamps.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import openai
import pytest

from chatstate.adapter import (
    AttemptFailed,
    Completion,
    ModelSettings,
    RetryingAdapter,
    RetryPolicy,
    make_adapter,
)
from chatstate.adapter._policy import parse_retry_after
from chatstate.adapter.dialects.chat_completions import CHAT_COMPLETIONS
from chatstate.errors import ModelError
from chatstate.testing import FakeModel

CANARY = "sk-canary-XYZ"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": "what is durable storage?"},
]

MakeAdapter = Callable[..., RetryingAdapter]


@pytest.fixture(autouse=True)
def _clean_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No developer env var or .env file may leak into what a test configures."""
    for name in ("MODEL", "BASE_URL", "API_KEY", "TIMEOUT", "MAX_RETRIES", "BACKOFF_BASE",
                 "CONNECT_TIMEOUT", "BACKOFF_MAX", "RETRY_AFTER_MAX"):
        monkeypatch.delenv(f"CHATSTATE_{name}", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=12) as server:
        yield server


@pytest.fixture(params=["wire", "sdk"])
def make(request: pytest.FixtureRequest, fake: FakeModel) -> Generator[MakeAdapter]:
    """Build an adapter of the parametrised kind pointed at the fake."""
    made: list[RetryingAdapter] = []

    def build(**options: Any) -> RetryingAdapter:
        options.setdefault("backoff_base", 0.01)
        options.setdefault("model", "test-model")
        if request.param == "sdk":
            client = openai.OpenAI(base_url=fake.base_url, api_key=CANARY)
            adapter = make_adapter(client=client, **options)
        else:
            adapter = make_adapter(base_url=fake.base_url, api_key=CANARY, **options)
        made.append(adapter)
        return adapter

    yield build
    for adapter in made:
        adapter.close()


def collect(items: Iterator[str | Completion]) -> tuple[list[str], Completion]:
    deltas: list[str] = []
    final: Completion | None = None
    for item in items:
        if isinstance(item, Completion):
            assert final is None, "exactly one Completion, last"
            final = item
        else:
            assert final is None, "no delta after the Completion"
            deltas.append(item)
    assert final is not None
    return deltas, final


def chat_log(fake: FakeModel) -> list[dict[str, Any]]:
    return [e for e in fake.request_log if e["path"] == "/v1/chat/completions"]


# -- replies ----------------------------------------------------------------------------------


def test_complete_returns_the_deterministic_reply(make: MakeAdapter, fake: FakeModel) -> None:
    reply = make().complete(MESSAGES)
    assert reply.text == fake.reply_for(MESSAGES)
    assert reply.text.startswith("Echo: what is durable storage?")
    assert reply.model == "test-model"
    assert reply.finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage["total_tokens"] > 0


def test_stream_deltas_add_up_to_the_same_reply(make: MakeAdapter, fake: FakeModel) -> None:
    adapter = make()
    deltas, final = collect(adapter.stream(MESSAGES))
    assert len(deltas) > 1
    assert "".join(deltas) == final.text == adapter.complete(MESSAGES).text
    assert final.usage == adapter.complete(MESSAGES).usage
    assert final.finish_reason == "stop"
    body = chat_log(fake)[0]["body"]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.invariant(10)
def test_each_call_sends_the_whole_list_and_params(make: MakeAdapter, fake: FakeModel) -> None:
    adapter = make()
    adapter.complete(MESSAGES[:2])
    reply = adapter.complete(MESSAGES, model="other-model",
                             params={"temperature": 0.25, "max_tokens": 3})
    first, second = chat_log(fake)
    assert first["messages"] == MESSAGES[:2]
    assert second["messages"] == MESSAGES
    assert second["body"]["temperature"] == 0.25
    assert second["model"] == "other-model"
    assert reply.finish_reason == "length"
    assert reply.text == fake.reply_for(MESSAGES, max_tokens=3)


# -- retries ----------------------------------------------------------------------------------


@pytest.mark.invariant(10)
@pytest.mark.parametrize("streamed", [False, True])
def test_429_retry_after_is_honoured(make: MakeAdapter, fake: FakeModel, streamed: bool) -> None:
    fake.fail_next(429, times=2, retry_after=0.25)
    adapter = make()
    text = (collect(adapter.stream(MESSAGES))[1].text if streamed
            else adapter.complete(MESSAGES).text)
    assert text == fake.reply_for(MESSAGES)
    log = chat_log(fake)
    assert [e["status"] for e in log] == [429, 429, 200]
    assert all(e["messages"] == MESSAGES for e in log)
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(log)]
    assert all(gap >= 0.25 for gap in gaps), gaps


def test_retry_after_is_capped(fake: FakeModel) -> None:
    fake.fail_next(503, retry_after=30)
    settings = ModelSettings(base_url=fake.base_url, retry_after_max=0.05)
    started = time.monotonic()
    assert make_adapter(settings=settings).complete(MESSAGES).text
    assert time.monotonic() - started < 15  # uncapped it would wait 30 s; margin for a loaded box


@pytest.mark.invariant(10)
def test_5xx_until_retries_run_out(make: MakeAdapter, fake: FakeModel) -> None:
    fake.fail_next(503, times=10)
    with pytest.raises(ModelError) as caught:
        make(max_retries=2).complete(MESSAGES)
    error = caught.value
    assert error.status == 503
    assert error.retryable
    assert "HTTP 503" in str(error)
    assert "after 3 attempts" in str(error)
    assert "try again later" in str(error)
    assert error.provider_message
    assert "(fake)" in error.provider_message
    assert len(chat_log(fake)) == 3  # the SDK's own retries are off: no multiplication


def test_401_is_not_retried(make: MakeAdapter, fake: FakeModel) -> None:
    fake.fail_next(401, times=3)
    with pytest.raises(ModelError) as caught:
        make().complete(MESSAGES)
    assert caught.value.status == 401
    assert not caught.value.retryable
    assert "OPENAI_API_KEY" in str(caught.value)
    assert len(chat_log(fake)) == 1


def test_rule_fails_only_matching_requests(make: MakeAdapter, fake: FakeModel) -> None:
    fake.add_rule(contains="FAIL-ME", status=400)
    adapter = make()
    with pytest.raises(ModelError) as caught:
        adapter.complete([{"role": "user", "content": "please FAIL-ME now"}])
    assert caught.value.status == 400
    assert "rejected" in str(caught.value)
    assert adapter.complete(MESSAGES).text == fake.reply_for(MESSAGES)


@pytest.mark.invariant(10)
def test_timeout_on_a_hanging_endpoint(make: MakeAdapter, fake: FakeModel) -> None:
    fake.hang_next(30.0, times=2)
    started = time.monotonic()
    with pytest.raises(ModelError) as caught:
        make(timeout=0.2, max_retries=1).complete(MESSAGES)
    assert time.monotonic() - started < 15  # without the timeout: 60 s; margin for a loaded box
    assert "did not answer within 0.2s" in str(caught.value)
    assert caught.value.retryable
    assert len(chat_log(fake)) == 2


@pytest.mark.invariant(10)
def test_connection_refused_is_retried_then_reported(fake: FakeModel) -> None:
    url = fake.base_url
    fake.close()
    with pytest.raises(ModelError) as caught:
        make_adapter(base_url=url, max_retries=1, backoff_base=0.01).complete(MESSAGES)
    assert "could not connect" in str(caught.value)
    assert "after 2 attempts" in str(caught.value)


# -- streams that drop ------------------------------------------------------------------------


@pytest.mark.invariant(10)
@pytest.mark.parametrize("clean", [False, True], ids=["connection-cut", "early-end"])
def test_cut_stream_is_resumed_without_duplication(make: MakeAdapter, fake: FakeModel,
                                                   clean: bool) -> None:
    fake.cut_stream_next(after_chunks=4, clean=clean)
    deltas, final = collect(make().stream(MESSAGES))
    expected = fake.reply_for(MESSAGES)
    assert "".join(deltas) == final.text == expected
    assert final.usage is not None
    assert len(chat_log(fake)) == 2


def test_cut_stream_out_of_retries_says_how_far_it_got(make: MakeAdapter,
                                                       fake: FakeModel) -> None:
    fake.cut_stream_next(after_chunks=3, times=5)
    shown: list[str] = []
    with pytest.raises(ModelError) as caught:
        for item in make(max_retries=2).stream(MESSAGES):
            assert isinstance(item, str)
            shown.append(item)
    text = "".join(shown)
    assert text
    assert fake.reply_for(MESSAGES).startswith(text)
    assert f"cut after {len(text)} characters" in str(caught.value)
    assert caught.value.retryable
    assert len(chat_log(fake)) == 3


@pytest.mark.parametrize("streamed", [False, True])
def test_malformed_reply_is_a_clear_error(make: MakeAdapter, fake: FakeModel,
                                          streamed: bool) -> None:
    fake.malformed_next()
    adapter = make()
    with pytest.raises(ModelError) as caught:
        if streamed:
            list(adapter.stream(MESSAGES))
        else:
            adapter.complete(MESSAGES)
    assert "not OpenAI-compatible" in str(caught.value)
    assert "malformed" in str(caught.value)
    assert caught.value.status is None
    assert not caught.value.retryable
    assert len(chat_log(fake)) == 1


# -- tool calls and content parts ----------------------------------------------------------

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
RICH = [
    {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;"
                                                                     "base64,iVBORw0KGgo="}}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "user", "content": "and now weather in Oslo and Rome"},
]
WEATHER = [{"name": "get_weather", "arguments": {"city": "Oslo"}},
           {"name": "get_weather", "arguments": '{"city": "Rome", "note": "\u00e9t\u00e9 \u2603"}'}]


@pytest.mark.parametrize("text", ["", "Let me check both. "], ids=["calls-only", "mixed"])
def test_tool_calls_streamed_in_1_byte_pieces_match_the_whole_reply(
        make: MakeAdapter, fake: FakeModel, text: str) -> None:
    fake.add_tool_rule(contains="weather in Oslo", calls=WEATHER, text=text)
    fake.configure(arg_chunk=1)
    adapter = make()
    whole = adapter.complete(RICH, params={"tools": TOOLS, "tool_choice": "auto"})
    deltas, final = collect(adapter.stream(RICH, params={"tools": TOOLS, "tool_choice": "auto"}))
    assert "".join(deltas) == final.text == whole.text == text
    assert final.finish_reason == whole.finish_reason == "tool_calls"
    assert final.tool_calls == whole.tool_calls
    assert final.tool_calls is not None
    assert len(final.tool_calls) == 2
    first, second = final.tool_calls
    assert first["type"] == "function"
    assert first["id"] != second["id"]
    assert first["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert second["function"]["arguments"] == WEATHER[1]["arguments"]  # byte for byte
    streamed = chat_log(fake)[-1]
    assert streamed["body"]["tools"] == TOOLS
    assert streamed["body"]["tool_choice"] == "auto"
    assert streamed["messages"] == RICH  # parts, calls and results reach the model as given
    # arguments really arrived one character per chunk
    assert streamed["stream"]
    assert fake.script.options.arg_chunk == 1


def test_a_reply_that_reads_tool_results(make: MakeAdapter, fake: FakeModel) -> None:
    reply = make().complete(RICH[:3])
    assert reply.text == "Tool results: call_1=sunny"
    assert reply.tool_calls is None


def test_a_stream_cut_inside_tool_call_deltas_is_retried_whole(make: MakeAdapter,
                                                               fake: FakeModel) -> None:
    fake.add_tool_rule(contains="weather in Oslo", calls=WEATHER, text="Checking. ")
    fake.configure(arg_chunk=1)
    adapter = make()
    expected = adapter.complete(RICH)
    fake.cut_stream_next(after_chunks=12)  # inside the first call's arguments
    deltas, final = collect(adapter.stream(RICH))
    assert "".join(deltas) == "Checking. "
    assert final.tool_calls == expected.tool_calls  # nothing of the cut attempt leaks in
    assert [e["behaviour"] for e in chat_log(fake)][-2:] == ["cut", "ok"]


def test_streamed_tool_calls_and_provider_fields_are_assembled_by_index() -> None:
    from chatstate.adapter.dialects.chat_completions import StreamAccumulator

    acc = StreamAccumulator()
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "reasoning": "think"}}]},
        {"choices": [{"delta": {"reasoning": "ing", "tool_calls": [
            {"index": 1, "id": "b", "type": "function",
             "function": {"name": "g", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [
            {"index": 0, "id": "a", "type": "function", "function": {"name": "f"}}]}}]},
        *({"choices": [{"delta": {"tool_calls": [
            {"index": i % 2, "function": {"arguments": ch}}]}}]}
          for i, ch in enumerate('{{""xy}}')),
        {"choices": [{"delta": {"content": "done"}, "finish_reason": "tool_calls"}]},
    ]
    assert [acc.feed(c) for c in chunks][-1] == "done"
    reply = acc.reply()
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"])
            for c in reply.tool_calls or ()] == [("a", "f", '{"x}'), ("b", "g", '{"y}')]
    assert reply.extra == {"reasoning": "thinking"}


def test_a_refusal_is_kept_as_an_extra_field() -> None:
    from chatstate.adapter.dialects.chat_completions import parse_completion

    reply = parse_completion({"choices": [{"message": {
        "role": "assistant", "content": None, "refusal": "I can't help with that."},
        "finish_reason": "stop"}]})
    assert reply.text == ""
    assert reply.extra == {"refusal": "I can't help with that."}


@pytest.mark.parametrize("calls", [
    [{"index": 0, "function": {"arguments": "{}"}}],  # never got an id or a name
    [{"function": {"name": "f"}}],                    # no index
    [{"index": 0, "id": "a", "function": {"name": "f", "arguments": 5}}],
], ids=["no-id", "no-index", "non-string-arguments"])
def test_misshapen_tool_call_deltas_are_malformed(calls: list[dict[str, Any]]) -> None:
    from chatstate.adapter.dialects.chat_completions import StreamAccumulator

    acc = StreamAccumulator()
    with pytest.raises(AttemptFailed, match="malformed"):
        acc.feed({"choices": [{"delta": {"tool_calls": calls}, "finish_reason": "tool_calls"}]})
        acc.reply()


class ScriptedBackend:
    """A Backend peer that replays given streams: for what the fake cannot do (diverge)."""

    dialect = CHAT_COMPLETIONS
    endpoint: str = "scripted://model"
    secret: str | None = None
    timeout: float | None = None

    def __init__(self, *streams: tuple[list[str], bool]) -> None:
        self.streams = list(streams)

    def send(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        raise NotImplementedError

    def stream(self, body: Mapping[str, Any]) -> Generator[Mapping[str, Any], None, None]:
        pieces, finished = self.streams.pop(0)
        for piece in pieces:
            yield {"choices": [{"delta": {"content": piece}, "finish_reason": None}]}
        if not finished:
            raise AttemptFailed("cut", "the connection dropped", retryable=True)
        yield {"choices": [{"delta": {}, "finish_reason": "stop"}]}

    def close(self) -> None:
        pass


@pytest.mark.invariant(2)
@pytest.mark.parametrize("retry", [["Hello ", "there ", "Bob"], ["Hel"]],
                         ids=["diverges", "ends-short"])
def test_a_retried_stream_never_contradicts_what_was_shown(retry: list[str]) -> None:
    backend = ScriptedBackend((["Hello ", "world"], False), (retry, True))
    adapter = RetryingAdapter(backend, model="m", sleep=lambda s: None)
    shown: list[str] = []
    with pytest.raises(ModelError) as caught:
        for item in adapter.stream(MESSAGES):
            shown.append(item)  # type: ignore[arg-type]
    assert "".join(shown) == "Hello world"
    assert "cut after 11 characters" in str(caught.value)
    assert caught.value.retryable


def test_a_retried_stream_swallows_the_prefix_across_chunk_boundaries() -> None:
    backend = ScriptedBackend((["Hel", "lo wo"], False), (["H", "ello w", "orld!"], True))
    adapter = RetryingAdapter(backend, model="m", sleep=lambda s: None)
    deltas, final = collect(adapter.stream(MESSAGES))
    assert deltas == ["Hel", "lo wo", "rld!"]
    assert final.text == "Hello world!"


def test_an_error_event_mid_stream_is_retried_when_the_provider_says_so() -> None:
    class ErrorThenReply(ScriptedBackend):
        def stream(self, body: Mapping[str, Any]) -> Generator[Mapping[str, Any], None, None]:
            if self.streams:
                self.streams.pop()
                yield {"error": {"message": "Overloaded", "type": "server_error"}}
            yield {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}

    adapter = RetryingAdapter(ErrorThenReply(([], False)), model="m", sleep=lambda s: None)
    assert collect(adapter.stream(MESSAGES))[1].text == "ok"
    fatal = RetryingAdapter(ErrorThenReply(([], False)), model="m",
                            policy=RetryPolicy(max_retries=0))
    with pytest.raises(ModelError, match="Overloaded"):
        list(fatal.stream(MESSAGES))


# -- secrets ----------------------------------------------------------------------------------


@pytest.mark.invariant(9)
def test_the_api_key_never_appears_in_errors_or_the_log(make: MakeAdapter,
                                                       fake: FakeModel) -> None:
    adapter = make(max_retries=0, timeout=0.2)
    texts: list[str] = [repr(adapter)]
    fake.fail_next(401, message=f"Incorrect API key provided: {CANARY}.")
    fake.fail_next(503)
    fake.malformed_next()
    fake.hang_next(1.0)
    for _ in range(4):
        with pytest.raises(ModelError) as caught:
            adapter.complete(MESSAGES)
        error: BaseException | None = caught.value
        texts += [str(caught.value), repr(caught.value), str(caught.value.provider_message)]
        while error is not None:
            texts.append(str(error))
            error = error.__cause__
    log = chat_log(fake)
    assert all(entry["authorization"] is True for entry in log)
    assert CANARY not in "\n".join(texts) + json.dumps(log)
    assert "Authorization" not in json.dumps(log)


# -- policy and settings ----------------------------------------------------------------------


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"Retry-After": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "9"}) == 0.25
    when = "Wed, 21 Oct 2015 07:28:10 GMT"
    assert parse_retry_after({"Retry-After": when}, now=1445412480.0) == 10.0
    assert parse_retry_after({"Retry-After": when}, now=1445412500.0) == 0.0
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None


def test_backoff_grows_with_jitter_and_respects_limits() -> None:
    policy = RetryPolicy(max_retries=3, backoff_base=1.0, backoff_max=3.0, retry_after_max=5.0)
    transient = AttemptFailed("http", "HTTP 503", status=503, retryable=True)
    delays = [policy.delay(transient, n) for n in (1, 2, 3)]
    assert 0.5 <= delays[0] <= 1.0  # type: ignore[operator]
    assert 1.0 <= delays[1] <= 2.0  # type: ignore[operator]
    assert 1.5 <= delays[2] <= 3.0  # type: ignore[operator]
    assert policy.delay(transient, 4) is None
    assert policy.delay(AttemptFailed("http", "", status=400), 1) is None
    slow = AttemptFailed("http", "", status=429, retryable=True, retry_after=120)
    assert policy.delay(slow, 1) == 5.0


def test_settings_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    Path(".env").write_text("OPENAI_API_KEY=from-dotenv\nCHATSTATE_MODEL=dotenv-model\n"
                            "CHATSTATE_BASE_URL=http://dotenv.invalid/v1\n"
                            "CHATSTATE_MAX_RETRIES=7\n")
    settings = ModelSettings()
    assert settings.api_key is not None
    assert settings.api_key.get_secret_value() == "from-dotenv"
    assert (settings.model, settings.max_retries) == ("dotenv-model", 7)
    assert "from-dotenv" not in repr(settings)

    monkeypatch.setenv("OPENAI_API_KEY", "from-openai-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://openai-env.invalid/v1")
    settings = ModelSettings()
    assert settings.api_key is not None
    assert settings.api_key.get_secret_value() == "from-openai-env"
    assert settings.base_url == "http://openai-env.invalid/v1"

    monkeypatch.setenv("CHATSTATE_API_KEY", "from-chatstate-env")
    monkeypatch.setenv("CHATSTATE_BASE_URL", "http://chatstate-env.invalid/v1")
    monkeypatch.setenv("CHATSTATE_MODEL", "env-model")
    settings = ModelSettings()
    assert settings.api_key is not None
    assert settings.api_key.get_secret_value() == "from-chatstate-env"
    assert (settings.base_url, settings.model) == ("http://chatstate-env.invalid/v1", "env-model")

    adapter = make_adapter(model="arg-model", base_url="http://arg.invalid/v1", api_key="arg")
    assert adapter.model == "arg-model"
    assert adapter.backend.endpoint == "http://arg.invalid/v1/chat/completions"
    assert adapter.backend.secret == "arg"
    assert adapter.policy.max_retries == 7
    adapter.close()


def test_make_adapter_rejects_mixed_configuration(fake: FakeModel) -> None:
    with pytest.raises(TypeError, match=r"openai\.OpenAI"):
        make_adapter(client=object())
    client = openai.OpenAI(base_url=fake.base_url, api_key=CANARY)
    with pytest.raises(ValueError, match="client"):
        make_adapter(client=client, base_url=fake.base_url)


def test_public_names_are_pinned() -> None:
    import chatstate.adapter

    assert chatstate.adapter.__all__ == [
        "AttemptFailed", "Backend", "Completion", "ModelAdapter", "ModelSettings",
        "RetryPolicy", "RetryingAdapter", "make_adapter"]
    assert chatstate.adapter.ModelSettings is ModelSettings
    adapter = make_adapter(base_url="http://127.0.0.1:9/v1")
    assert isinstance(adapter, chatstate.adapter.ModelAdapter)
    adapter.close()


def test_importing_the_adapter_stays_light() -> None:
    """openai, httpx2 and pydantic-settings load only when an adapter is made."""
    code = ("import sys, chatstate; before = set(sys.modules); import chatstate.adapter; "
            "new = set(sys.modules) - before; "
            "print(sorted(m for m in ('openai', 'httpx2', 'pydantic_settings') if m in new))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_no_api_key_for_the_openai_default_is_a_clear_error_before_any_request(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from chatstate.errors import ModelError

    monkeypatch.chdir(tmp_path)  # no .env here
    for name in ("OPENAI_API_KEY", "CHATSTATE_API_KEY", "OPENAI_BASE_URL", "CHATSTATE_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelError, match=r"no API key .* --model fake"):
        make_adapter()


def test_dotenv_syntax_and_empty_values(monkeypatch: pytest.MonkeyPatch) -> None:
    Path(".env").write_text(
        "# a comment\n\nexport CHATSTATE_MODEL='quoted model'\n"
        'CHATSTATE_BASE_URL="http://dotenv.invalid/v1" # trailing comment\n'
        "chatstate_max_retries=5  # lower-case name, inline comment\n"
        "OPENAI_API_KEY=\n"  # empty: unset, as in .env.example
        "not a variable line\n")
    settings = ModelSettings()
    assert settings.model == "quoted model"
    assert settings.base_url == "http://dotenv.invalid/v1"
    assert settings.max_retries == 5
    assert settings.api_key is None
    monkeypatch.setenv("CHATSTATE_MODEL", "")  # empty in the environment: the .env value
    assert ModelSettings().model == "quoted model"
    monkeypatch.setenv("chatstate_model", "lower-env")
    assert ModelSettings(timeout=5).model == "lower-env"


def test_a_bad_value_or_unreadable_dotenv_is_a_clear_error() -> None:
    from pydantic import ValidationError

    Path(".env").write_text("CHATSTATE_MAX_RETRIES=lots\n")
    with pytest.raises(ValidationError, match="max_retries"):
        ModelSettings()
    Path(".env").write_bytes(b"CHATSTATE_MODEL=\xff\xfe\n")
    with pytest.raises(ValueError, match=r"\.env"):
        ModelSettings()


def test_plain_settings_match_the_model_when_nothing_needs_validating(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's text-only configuration skips building ModelSettings; the values,
    defaults included, are the same as the model's."""
    from dataclasses import fields

    from chatstate.adapter._env import PlainSettings, resolve

    plain = resolve({"model": "m", "base_url": "http://127.0.0.1:9/v1"})
    model = ModelSettings(model="m", base_url="http://127.0.0.1:9/v1")
    assert isinstance(plain, PlainSettings)
    names = [f.name for f in fields(PlainSettings) if f.name != "model_fields_set"]
    assert sorted(names) == sorted(ModelSettings.model_fields)
    assert {n: getattr(plain, n) for n in names} == model.model_dump()
    policy = RetryPolicy()  # its defaults, too, are the settings' defaults
    assert (policy.max_retries, policy.backoff_base, policy.backoff_max,
            policy.retry_after_max) == (model.max_retries, model.backoff_base,
                                        model.backoff_max, model.retry_after_max)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary")
    keyed = resolve({})
    assert keyed.api_key.get_secret_value() == "sk-canary"
    assert "sk-canary" not in repr(keyed)
    monkeypatch.setenv("CHATSTATE_TIMEOUT", "5")  # a number: validated by the model
    assert isinstance(resolve({}), ModelSettings)
    assert resolve({}).timeout == 5.0
