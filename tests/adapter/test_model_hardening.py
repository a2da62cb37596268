"""Issue 11, sections 3 and 5 on the fake model: secrets in URLs, the history file's mode,
replies cut short, strict role alternation, error texts, doctor's endpoint check, the
waiting spinner, clipped listings, requested model and nested usage.

The same behaviours against llama.cpp's real server are in test_real_model.py.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pexpect
import pytest
from support.cli_helpers import CHATSTATE, cli_env, invoke, replay_json, run_cli

from chatstate.adapter import make_adapter
from chatstate.adapter.dialects.chat_completions import parse_completion
from chatstate.core.transcript import Message
from chatstate.errors import ModelError
from chatstate.ops import doctor
from chatstate.session.chat import Chat
from chatstate.stores.s3 import _transport as _s3io
from chatstate.testing import FakeModel

# Names that are new with these fixes are imported inside the tests that use them, so
# that on the code before the fixes each test fails on its own behaviour.
CONTINUE_PROMPT = "Continue exactly where your previous reply stopped."

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")

PASSWORD = "hunter2-proxy-pw"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fake() -> Any:
    with FakeModel() as f:
        yield f


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"json://{tmp_path}/store"


def chat_on(store_url: str, fake: FakeModel, cid: str = "c1", **kw: Any) -> Chat:
    return Chat(store_url, conversation_id=cid, base_url=fake.base_url, api_key="k-test",
                model="fake-model", **kw)


# -- 3. secrets ----------------------------------------------------------------------------
def test_one_redaction_function_serves_doctor_s3_and_the_adapter() -> None:
    from chatstate.core.redact import redact_url, scrub

    assert doctor.scrub is scrub
    assert doctor.redact_url is redact_url
    assert _s3io.scrub is scrub
    assert redact_url(f"https://user:{PASSWORD}@proxy/v1") == "https://[redacted]@proxy/v1"
    text = f"failed: https://user:{PASSWORD}@proxy/v1/chat and http://a@b/ ok"
    assert scrub(text) == "failed: https://[redacted]@proxy/v1/chat and http://[redacted]@b/ ok"
    assert scrub("x\n\nDebug source: Foo { secret }") == "x"


@pytest.mark.invariant(9)
def test_credentials_in_the_base_url_never_show(tmp_path: Path, store_url: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    base = f"http://user:{PASSWORD}@127.0.0.1:{closed_port()}/v1"
    adapter = make_adapter(base_url=base, api_key="k", max_retries=1, backoff_base=0)
    assert PASSWORD not in repr(adapter)
    with caplog.at_level(logging.WARNING, logger="chatstate"), \
            pytest.raises(ModelError) as info:
        adapter.complete([{"role": "user", "content": "hi"}])
    assert PASSWORD not in str(info.value)
    assert "[redacted]@127.0.0.1" in str(info.value)
    assert caplog.records
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)
    # the CLI: ask's error, doctor's text and --json
    env = {"CHATSTATE_BASE_URL": base, "CHATSTATE_API_KEY": "k-test-key",
           "CHATSTATE_MAX_RETRIES": "0"}
    asked = invoke(["ask", "--id", "s", "hi"], store=store_url, env=env)
    assert asked.code == 1
    assert "[redacted]@" in asked.err
    assert PASSWORD not in asked.err
    for args in (["doctor"], ["doctor", "--json"]):
        result = run_cli(args, cli_env(tmp_path, **env), store=store_url)
        assert result.code == 1, result.out
        assert "[redacted]@127.0.0.1" in result.out
        assert PASSWORD not in result.out + result.err
    stored = (tmp_path / "store").rglob("*")
    assert not any(PASSWORD.encode() in p.read_bytes() for p in stored if p.is_file())


@pytest.mark.invariant(9)
def test_stored_params_carry_no_credentials(store_url: str, fake: FakeModel) -> None:
    chat = chat_on(store_url, fake)
    chat.send("hi", user=f"https://me:{PASSWORD}@proxy/v1",
              metadata={"k": ["sk-abcdefghijklmnop"]})
    stored = Chat(store_url, conversation_id="c1", base_url=fake.base_url,
                  api_key="k").messages[0].params
    assert stored == {"user": "https://[redacted]@proxy/v1",
                      "metadata": {"k": ["sk-[redacted]"]}}
    assert fake.request_log[-1]["body"]["user"] == f"https://me:{PASSWORD}@proxy/v1"


@pytest.mark.invariant(9)
def test_repl_history_file_is_created_0600(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from prompt_toolkit.history import FileHistory

    from chatstate.cli.repl.line_input import private_history_file

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    old = os.umask(0o022)
    try:
        path = private_history_file()
        FileHistory(str(path)).append_string("my secret question")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.chmod(0o644)  # one made readable by an older version is tightened
    assert stat.S_IMODE(private_history_file().stat().st_mode) == 0o600


@pytest.mark.invariant(9)
def test_repl_on_a_tty_writes_its_history_0600(tmp_path: Path, store_url: str) -> None:
    env = cli_env(tmp_path)
    child = pexpect.spawn(CHATSTATE, ["--store", store_url, "chat", "--model", "fake"],
                          env=env, encoding="utf-8", timeout=30, dimensions=(50, 200))
    child.expect("you>")
    child.sendline("a private line")
    child.expect("Echo: a private line")
    child.expect("you>")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    history = next((tmp_path / "home" / "state").rglob("history"))
    assert "a private line" in history.read_text()
    assert stat.S_IMODE(history.stat().st_mode) == 0o600


# -- 5. replies cut short ------------------------------------------------------------------
def test_a_length_cut_reply_is_stored_shown_and_continued(store_url: str,
                                                          fake: FakeModel) -> None:
    chat = chat_on(store_url, fake, params={"max_tokens": 3})
    reply = chat.send("tell me everything")
    assert reply.finish_reason == "length"
    assert chat.cut_short == reply
    from chatstate.session.sendable import CONTINUE_PROMPT as prompt
    assert prompt == CONTINUE_PROMPT
    assert chat.interrupted is None
    again = chat.retry()
    assert chat.messages[-2].content == CONTINUE_PROMPT
    assert again.role == "assistant"
    sent = fake.request_log[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == reply.content


def test_ask_says_the_reply_was_cut_and_retry_continues(store_url: str,
                                                        fake: FakeModel) -> None:
    fake.configure(reply_words=40)
    env = {"CHATSTATE_BASE_URL": fake.base_url, "CHATSTATE_API_KEY": "k-test-key",
           "CHATSTATE_MODEL": "fake-model"}
    chat_on(store_url, fake, cid="cut", params={"max_tokens": 2}).send("hello")
    first = invoke(["ask", "--id", "cut2", "--json", "hi"], store=store_url, env=env)
    assert first.json()["finish_reason"] == "stop"
    result = invoke(["ask", "--id", "cut", "--retry"], store=store_url, env=env)
    assert result.code == 0, result.err
    assert "continue" in result.err
    doc = replay_json(store_url, "cut")["messages"]
    assert doc[1]["finish_reason"] == "length"
    assert doc[2]["content"] == CONTINUE_PROMPT
    # a cut reply made by ask itself is announced on stderr
    cut = invoke(["ask", "--id", "cut3", "hi"], store=store_url,
                 env={**env, "CHATSTATE_MODEL": "fake-model"})
    assert "note:" not in cut.err  # a normal stop says nothing
    Chat(store_url, conversation_id="cut4", base_url=fake.base_url, api_key="k",
         params={"max_tokens": 2}).send("x")
    shown = invoke(["ask", "--id", "cut4", "--retry"], store=store_url, env=env)
    assert shown.code == 0
    assert "cut short" in shown.err


def test_old_messages_keep_their_hash() -> None:
    """A message sealed before finish_reason/requested_model existed hashes the same."""
    from chatstate.core.canonical import canonical_json, chain_hash

    old = Message.seal(None, role="assistant", content="x", turn_id="t-1", model="m",
                       usage={"prompt_tokens": 1}, created_at="2025-01-01T00:00:00.000000Z")
    body = {"seq": 0, "role": "assistant", "content": "x", "created_at": old.created_at,
            "turn_id": "t-1", "status": "complete", "model": "m",
            "usage": {"prompt_tokens": 1}, "params": None}  # every field schema 1 had
    assert old.hash == chain_hash(None, canonical_json(body))
    cut = Message.seal(None, role="assistant", content="x", turn_id="t-1", model="m",
                       usage={"prompt_tokens": 1}, finish_reason="length",
                       created_at="2025-01-01T00:00:00.000000Z")
    assert '"finish_reason":"length"' in cut.body()
    assert cut.hash != old.hash


def test_nested_usage_and_requested_model_are_kept(store_url: str, fake: FakeModel) -> None:
    reply = parse_completion({"model": "served", "choices": [
        {"message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 3,
                                                                "audio_tokens": None}}})
    assert reply.usage == {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 3}}
    msg = Message.seal(None, role="assistant", content="hi", turn_id="t", usage=reply.usage)
    assert Message.model_validate(msg.model_dump()).usage == reply.usage
    fake.configure(model="served-name")
    chat = Chat(store_url, conversation_id="rm", base_url=fake.base_url, api_key="k",
                model="asked-name")
    sent = chat.send("hi")
    assert sent.model == "asked-name"
    assert sent.requested_model is None  # the fake echoes it
    fake.reset()


# -- 5. strict alternation -----------------------------------------------------------------
def test_a_new_message_after_a_failed_turn_keeps_a_strict_model_working(
        store_url: str, fake: FakeModel) -> None:
    fake.configure(strict_roles=True)
    chat = chat_on(store_url, fake)
    chat.send("one")
    fake.fail_next(400, message="bad request")
    with pytest.raises(ModelError):
        chat.send("two")
    assert chat.interrupted is not None
    reply = chat.send("three")  # on main: user,user -> 400 from the strict template
    assert reply.status == "complete"
    sent = fake.request_log[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"] == ["one", "three"]
    assert [m.content for m in chat.messages if m.role == "user"] == ["one", "two", "three"]
    assert chat_on(store_url, fake).send("four").status == "complete"


def test_strict_fake_rejects_two_user_messages_like_llama_cpp(fake: FakeModel) -> None:
    fake.configure(strict_roles=True)
    adapter = make_adapter(base_url=fake.base_url, api_key="k", max_retries=0)
    with pytest.raises(ModelError) as info:
        adapter.complete([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert info.value.status == 400
    assert "roles must alternate" in str(info.value)
    assert not info.value.retryable


# -- 5. error texts ------------------------------------------------------------------------
LLAMA_OVERFLOW = ("request (831 tokens) exceeds the available context size (512 tokens), "
                  "try increasing it")


def test_a_context_length_400_names_the_window_and_says_what_to_change(
        store_url: str, fake: FakeModel) -> None:
    env = {"CHATSTATE_BASE_URL": fake.base_url, "CHATSTATE_API_KEY": "k-test-key"}
    fake.fail_next(400, message=LLAMA_OVERFLOW, times=2)  # learning the window cannot help "hi"
    result = invoke(["ask", "--id", "ctx", "hi"], store=store_url, env=env)
    assert result.code == 1
    assert "831 tokens" in result.err
    assert "context window of 512 tokens" in result.err
    # "hi" is the whole request: a new conversation cannot help, a bigger window or a
    # split message can (issue 28)
    assert "split it" in result.err and "--context-window N" in result.err
    assert "--new" not in result.err
    assert "complete the turn with" not in result.err
    assert "would fail the same way" in result.err


def test_context_overflow_is_read_from_each_providers_words() -> None:
    from chatstate.adapter.dialects.chat_completions import context_overflow

    assert context_overflow({"error": {"message": LLAMA_OVERFLOW}}) == (512, 831)
    assert context_overflow({"error": {"message": "the request exceeds the available "
                                       "context size", "n_ctx": 256,
                                       "n_prompt_tokens": 300}}) == (256, 300)
    assert context_overflow(b'{"error": {"message": "This model\'s maximum context length '
                            b'is 8192 tokens. However, your messages resulted in 9000 '
                            b'tokens."}}') == (8192, 9000)
    assert context_overflow({"error": {"message": "model not found"}}) is None


def test_a_retryable_failure_keeps_the_retry_hint(store_url: str, fake: FakeModel) -> None:
    env = {"CHATSTATE_BASE_URL": fake.base_url, "CHATSTATE_API_KEY": "k-test-key",
           "CHATSTATE_MAX_RETRIES": "0"}
    fake.fail_next(503)
    result = invoke(["ask", "--id", "r", "hi"], store=store_url, env=env)
    assert "complete the turn with `chatstate ask --id r --retry`" in result.err


def test_error_sentences_join_and_the_provider_message_is_one_whole_line(
        store_url: str, fake: FakeModel) -> None:
    env = {"CHATSTATE_BASE_URL": fake.base_url, "CHATSTATE_API_KEY": "k-test-key"}
    url = "https://example.invalid/docs/" + "x" * 60
    message = "first line\n  second line: see " + ("word " * 190) + url + " trailing words"
    fake.fail_next(400, message=message)
    err = invoke(["ask", "--id", "e", "hi"], store=store_url, env=env).err
    assert ". Your message is stored" in err
    assert "parameters Your" not in err
    line = next(ln for ln in err.splitlines() if ln.startswith("error:"))
    assert "first line second line: see word" in line
    assert url not in line
    assert "https://example" not in line
    assert " …)" in line
    fake.fail_next(400, message="short\nmessage with " + url)
    line = next(ln for ln in invoke(["ask", "--id", "e2", "hi"], store=store_url,
                                    env=env).err.splitlines() if ln.startswith("error:"))
    assert f"(short message with {url})" in line


def test_the_first_timeout_says_which_setting_to_lower(fake: FakeModel,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    fake.hang_next(2.0, times=2)
    adapter = make_adapter(base_url=fake.base_url, api_key="k", timeout=0.3, max_retries=1,
                           backoff_base=0)
    with caplog.at_level(logging.WARNING, logger="chatstate"), pytest.raises(ModelError) as info:
        adapter.complete([{"role": "user", "content": "hi"}])
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "lower CHATSTATE_TIMEOUT" in warned[0], warned
    assert "2 attempts in all" in warned[0]
    assert "lower CHATSTATE_TIMEOUT" in str(info.value)


# -- 5. doctor checks the endpoint ---------------------------------------------------------
def test_doctor_is_not_ready_when_the_model_server_is_down(tmp_path: Path, store_url: str,
                                                           fake: FakeModel) -> None:
    down = cli_env(tmp_path, CHATSTATE_BASE_URL=f"http://127.0.0.1:{closed_port()}/v1",
                   CHATSTATE_API_KEY="k-test-key")
    result = run_cli(["doctor"], down, store=store_url)
    assert result.code == 1
    assert "NOT READY" in result.out
    assert "unreachable" in result.out
    assert run_cli(["doctor", "--store-only"], down, store=store_url).code == 0
    up = cli_env(tmp_path, CHATSTATE_BASE_URL=fake.base_url, CHATSTATE_API_KEY="k-test-key",
                 CHATSTATE_MODEL="fake-model")
    ready = run_cli(["doctor", "--json"], up, store=store_url)
    assert ready.code == 0, ready.out
    assert ready.json()["model"]["ok"]
    assert "fake-model" in ready.json()["model"]["detail"]
    assert any(e["path"] == "/v1/models" for e in fake.request_log)


# -- 5. waiting and listings ---------------------------------------------------------------
def test_ask_on_a_tty_shows_it_is_waiting(tmp_path: Path, store_url: str,
                                          fake: FakeModel) -> None:
    fake.hang_next(4.0)
    env = cli_env(tmp_path, CHATSTATE_BASE_URL=fake.base_url, CHATSTATE_API_KEY="k-test-key",
                  CHATSTATE_MODEL="fake-model")
    child = pexpect.spawn(CHATSTATE, ["--store", store_url, "ask", "--id", "w", "hi"],
                          env=env, encoding="utf-8", timeout=40)
    child.expect("waiting for the model… [0-9]+s")
    child.expect("Echo: hi")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_repl_greeting_and_history_clip_long_messages(tmp_path: Path, store_url: str,
                                                      fake: FakeModel) -> None:
    long_text = "start " + "filler " * 1500 + "end"
    chat_on(store_url, fake, cid="long").send(long_text)
    env = cli_env(tmp_path, CHATSTATE_BASE_URL=fake.base_url, CHATSTATE_API_KEY="k-test-key")
    result = run_cli(["chat", "--id", "long"], env, store=store_url, input="/history\n")
    assert result.code == 0, result.err
    assert result.out.count("more characters: `chatstate replay long` shows all") == 4
    assert len(result.out) < 4000
    assert "start filler" in result.out


def test_repl_waits_visibly_continues_cut_replies_and_survives_a_400(
        tmp_path: Path, store_url: str, fake: FakeModel) -> None:
    from support.cli_helpers import strip_ansi

    Chat(store_url, conversation_id="r", base_url=fake.base_url, api_key="k",
         model="fake-model", params={"max_tokens": 2}).send("long story please")
    fake.configure(strict_roles=True)
    env = cli_env(tmp_path, CHATSTATE_BASE_URL=fake.base_url, CHATSTATE_API_KEY="k-test-key",
                  CHATSTATE_MODEL="fake-model")
    child = pexpect.spawn(CHATSTATE, ["--store", store_url, "chat", "--id", "r", "--raw"], env=env,
                          encoding="utf-8", timeout=40, dimensions=(50, 200))
    child.expect("cut at the token limit; /continue asks the model to go on")
    child.expect("you>")
    fake.hang_next(4.0)
    child.sendline("/continue")
    child.expect("waiting for the model… [0-9]+s")
    child.expect("assistant> Echo: Continue")  # cut again: the turn's max_tokens carries on
    child.expect("you>")
    fake.fail_next(400, message="bad parameter")
    child.sendline("this one fails")
    child.expect(r"/retry would fail the same way")
    child.expect("you>")
    child.sendline("and this one works")
    child.expect(r"Echo: and this one works")
    child.expect("you>")
    shown = strip_ansi(child.before)
    assert "error" not in shown
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    sent = fake.request_log[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant"] * 2 + ["user"]


def test_doctor_library_call_checks_the_endpoint_on_request(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATSTATE_BASE_URL", f"http://127.0.0.1:{closed_port()}/v1")
    assert doctor.run(store_url, store_only=True).ready
    report = doctor.run(store_url, store_only=False)
    assert not report.ready
    assert report.model is not None
    assert not report.model["ok"]
