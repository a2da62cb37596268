"""An upstream that fails mid-stream, through serve's Responses and Anthropic Messages
routes: the client is told in its own API's shape, and the store keeps what it got.

The Responses stream ends ``error`` then ``response.failed`` (status ``failed``, its
``error``, the text so far), so the openai SDK reports the failure and its
``get_final_response`` raises instead of handing back a short reply as complete; the
Anthropic stream ends with an ``error`` event, so the anthropic SDK raises. Either way
the text the client received is the stored partial reply, the failure is recorded in
the conversation, and ``replay --verify`` passes. The openai SDK runs in the dev venv,
the anthropic SDK in its cached venv (as in test_serve_dialects).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from support.cli_helpers import cli_env, run_cli
from support.serve_helpers import ServeProcess, serve_env
from support.stores import load_once
from support.venvs import cached_venv
from test_serve_dialects import ANTHROPIC

from chatstate.core.transcript import Conversation
from chatstate.serve._stream_events import ResponsesEvents
from chatstate.testing import FakeModel

TOKEN = "tok-dialect-failures-0123456789abcdef012"
ID = "X-Chatstate-Conversation"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FakeModel, ServeProcess, str]]:
    url = f"sqlite://{tmp_path}/s.db"
    with FakeModel(reply_words=12) as fake, \
            ServeProcess(url, fake.base_url, serve_env(tmp_path), "--token", TOKEN) as proxy:
        yield fake, proxy, url


def stored(url: str, cid: str, tmp_path: Path) -> Conversation:
    """The conversation, after ``replay --verify`` of it passed in a fresh process."""
    replay = run_cli(["replay", cid, "--verify"], cli_env(tmp_path), store=url, timeout=120)
    assert replay.code == 0, replay.err
    return load_once(url, cid)


def kept_partial(conv: Conversation, received: str) -> dict[str, Any]:
    """The turn has no complete reply; its partial is what the client received."""
    assert [m.role for m in conv.messages] == ["user"], conv.messages
    assert conv.partial is not None and conv.partial.text == received and received
    failure: dict[str, Any] = conv.metadata["last_upstream_error"]
    return failure


def responses_events(client: openai.OpenAI, cid: str) -> list[Any]:
    return list(client.responses.create(model="fake-model", input=f"tell me {cid}",
                                        stream=True, extra_headers={ID: cid}))


def test_a_responses_stream_cut_upstream_ends_error_then_response_failed(
        served: tuple[FakeModel, ServeProcess, str], tmp_path: Path) -> None:
    fake, proxy, url = served
    client = openai.OpenAI(base_url=proxy.base_url, api_key=TOKEN, max_retries=0)
    fake.cut_stream_next(after_chunks=3)
    events = responses_events(client, "resp-cut")
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    error, failed = events[-2:]
    assert error.code == "server_error" and "kept as the partial reply" in error.message
    assert error.param is None
    created = next(e for e in events if e.type == "response.created")
    assert failed.response.id == created.response.id and failed.response.status == "failed"
    assert failed.response.error is not None and failed.response.error.code == "server_error"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert failed.response.output_text == text
    seqs = [e.sequence_number for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    failure = kept_partial(stored(url, "resp-cut", tmp_path), text)
    assert failure["status"] == 502 and "broke" in failure["detail"]
    # the SDK's stream helper: no response.completed, so no final response to mistake
    fake.cut_stream_next(after_chunks=3, clean=True)
    with client.responses.stream(model="fake-model", input="helper cut",
                                 extra_headers={ID: "resp-helper"}) as stream:
        seen = [e.type for e in stream]
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()
    assert seen[-2:] == ["error", "response.failed"]
    assert "ended without" in stored(url, "resp-helper", tmp_path).metadata[
        "last_upstream_error"]["detail"]


def test_a_responses_error_event_upstream_is_relayed_and_response_failed_added(
        served: tuple[FakeModel, ServeProcess, str], tmp_path: Path) -> None:
    fake, proxy, url = served
    client = openai.OpenAI(base_url=proxy.base_url, api_key=TOKEN, max_retries=0)
    fake.error_event_next(after_chunks=2, status=529, message="overloaded midway (fake)")
    events = responses_events(client, "resp-error")
    errors = [e for e in events if e.type == "error"]
    assert len(errors) == 1 and errors[0].message == "overloaded midway (fake)"  # once
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.message == "overloaded midway (fake)"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    failure = kept_partial(stored(url, "resp-error", tmp_path), text)
    assert failure["detail"].endswith("overloaded midway (fake)")


def test_an_upstream_response_failed_event_is_the_end_and_nothing_is_added() -> None:
    events = ResponsesEvents()
    assert events.see("response.created", {"type": "response.created", "sequence_number": 0,
                                           "response": {"id": "resp_1"}}) is None
    assert events.see("response.failed", {
        "type": "response.failed", "sequence_number": 1, "response": {
            "id": "resp_1", "status": "failed",
            "error": {"code": "rate_limit_exceeded", "message": "slow down"}}}) == (
        429, "slow down")
    assert events.closing(429, "slow down", "partial") == b"event: error\ndata: " + \
        json.dumps({"type": "error", "code": "rate_limit_exceeded", "message": "slow down",
                    "param": None, "sequence_number": 2}).encode() + b"\n\n"


ANTHROPIC_SCRIPT = r"""
import json, sys
import anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
out = {"version": anthropic.__version__}
for cid in sys.argv[3:]:
    got = []
    try:
        with client.messages.stream(model="fake-model", max_tokens=500,
                                    messages=[{"role": "user", "content": "tell me " + cid}],
                                    extra_headers={"X-Chatstate-Conversation": cid}) as s:
            for text in s.text_stream:
                got.append(text)
            final = s.get_final_message()
        out[cid] = {"raised": None, "text": "".join(got), "stop": final.stop_reason}
    except anthropic.APIError as exc:
        out[cid] = {"raised": type(exc).__name__, "text": "".join(got),
                    "body": exc.body if isinstance(exc.body, dict) else str(exc.body)}
print(json.dumps(out))
"""


def test_the_anthropic_sdk_raises_on_a_stream_that_failed_upstream(
        served: tuple[FakeModel, ServeProcess, str], tmp_path: Path) -> None:
    fake, proxy, url = served
    bin_dir = cached_venv("anthropic", ANTHROPIC, tier="anthropic client")
    fake.cut_stream_next(after_chunks=3)  # the first stream: cut
    fake.error_event_next(after_chunks=2, status=529, times=1)  # the second: overloaded
    proc = subprocess.run([str(bin_dir / "python"), "-c", ANTHROPIC_SCRIPT, proxy.root, TOKEN,
                           "msg-cut", "msg-overloaded"], capture_output=True, text=True,
                          timeout=120, check=False, env=serve_env(tmp_path))
    assert proc.returncode == 0, proc.stderr + proxy.stderr
    out = json.loads(proc.stdout)
    cut, overloaded = out["msg-cut"], out["msg-overloaded"]
    assert cut["raised"] == "APIStatusError" and cut["body"]["type"] == "error", cut
    assert cut["body"]["error"]["type"] == "api_error"
    assert "kept as the partial reply" in cut["body"]["error"]["message"]
    assert overloaded["raised"] and overloaded["body"]["error"]["type"] == "overloaded_error"
    failure = kept_partial(stored(url, "msg-cut", tmp_path), cut["text"])
    assert failure["status"] == 502
    failure = kept_partial(stored(url, "msg-overloaded", tmp_path), overloaded["text"])
    assert failure["status"] == 529 and "Overloaded" in failure["detail"]
