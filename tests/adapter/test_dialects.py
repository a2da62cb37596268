"""The dialect seam: the retry loop and the backends speak whatever dialect they are given.

A test dialect (chat completions with a marked request and shouted replies) runs
through the real wire backend against the fake server over loopback HTTP, so the
request the server saw and the reply the caller got both show the dialect's hand.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import ValidationError

from chatstate.adapter import Completion, ModelSettings, RetryingAdapter, make_adapter
from chatstate.adapter.backends.sdk import SdkBackend
from chatstate.adapter.backends.wire import WireBackend
from chatstate.adapter.dialects import DIALECTS, REGISTRY, dialect
from chatstate.adapter.dialects.base import Reply
from chatstate.adapter.dialects.chat_completions import (
    CHAT_COMPLETIONS,
    ChatCompletions,
    StreamAccumulator,
)
from chatstate.testing import FakeModel

MESSAGES = [{"role": "user", "content": "what is durable storage?"}]

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")


@pytest.fixture(autouse=True)
def _no_dotenv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)


class _ShoutingStream(StreamAccumulator):
    def feed(self, chunk: object) -> str:
        return super().feed(chunk).upper()

    def reply(self) -> Reply:
        return super().reply()._replace(text=self.text.upper())


class Shouting(ChatCompletions):
    """Chat completions, except that requests are marked and replies shouted."""

    name = "shouting"

    def encode(self, messages: Sequence[Mapping[str, Any]], *, model: str,
               params: Mapping[str, Any] | None, stream: bool) -> dict[str, Any]:
        return {**super().encode(messages, model=model, params=params, stream=stream),
                "user": "shouting-dialect"}

    def decode(self, data: object) -> Reply:
        reply = super().decode(data)
        return reply._replace(text=reply.text.upper())

    def stream_decoder(self) -> _ShoutingStream:
        return _ShoutingStream()


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=8) as server:
        yield server


def test_the_retry_loop_encodes_and_decodes_with_the_backends_dialect(fake: FakeModel) -> None:
    adapter = RetryingAdapter(WireBackend(fake.base_url, dialect=Shouting()), model="m")
    try:
        assert adapter.dialect is adapter.backend.dialect
        expected = fake.reply_for(MESSAGES).upper()
        assert adapter.complete(MESSAGES).text == expected
        items = list(adapter.stream(MESSAGES))
    finally:
        adapter.close()
    final = items[-1]
    assert isinstance(final, Completion)
    assert "".join(str(i) for i in items[:-1]) == final.text == expected
    bodies = [e["body"] for e in fake.request_log if e["path"] == "/v1/chat/completions"]
    assert [b["user"] for b in bodies] == ["shouting-dialect", "shouting-dialect"]
    assert [b.get("stream", False) for b in bodies] == [False, True]


def test_chat_completions_is_the_default_dialect_of_both_backends(fake: FakeModel) -> None:
    assert ModelSettings().api == "chat_completions"
    assert set(DIALECTS) == {"chat_completions", "responses", "anthropic_messages"}
    assert DIALECTS["chat_completions"] is CHAT_COMPLETIONS
    for name, (_, _, path) in REGISTRY.items():  # for_url's paths are the dialects' own
        assert DIALECTS[name].name == name and DIALECTS[name].path == path
    wire = make_adapter(base_url=fake.base_url)
    sdk = make_adapter(client=openai.OpenAI(base_url=fake.base_url, api_key="k"))
    try:
        for adapter in (wire, sdk):
            assert adapter.dialect is CHAT_COMPLETIONS
            assert adapter.backend.endpoint == fake.base_url + "/chat/completions"
    finally:
        wire.close()
        sdk.close()


def test_an_unknown_api_is_a_clear_error_naming_the_known_ones() -> None:
    with pytest.raises(ValidationError, match=r"unknown model api 'gopher'.*chat_completions"):
        ModelSettings(api="gopher")
    unchecked = ModelSettings().model_copy(update={"api": "gopher"})
    with pytest.raises(ValueError, match=r"unknown model api 'gopher'.*chat_completions"):
        make_adapter(settings=unchecked, base_url="http://127.0.0.1:9/v1")
    assert dialect("chat_completions") is CHAT_COMPLETIONS


def test_the_sdk_backend_refuses_a_dialect_the_sdk_has_no_method_for(fake: FakeModel) -> None:
    client = openai.OpenAI(base_url=fake.base_url, api_key="k")
    with pytest.raises(ValueError, match=r"cannot speak the 'shouting' api.*chat_completions"):
        SdkBackend(client, dialect=Shouting())


def test_the_backends_02_module_paths_still_import() -> None:
    for old, new in (("wire", "backends.wire"), ("sdk", "backends.sdk")):
        assert importlib.import_module(f"chatstate.adapter.{old}") is \
            importlib.import_module(f"chatstate.adapter.{new}")
