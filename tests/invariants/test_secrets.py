"""Secrets never land (invariant 9): a canary API key is greppable nowhere but the wire.

The key is set the ways a user sets it (CHATSTATE_API_KEY or OPENAI_API_KEY,
in the environment or in a ``.env`` file in the working directory); the CLI
then runs a streamed turn, a turn the fake model answers with a 401 that
echoes the key back (as real providers do), and a turn against a closed port.
The canary must not appear in any byte under the store directory, in stdout or
stderr (with --debug: tracebacks and debug logs), or in the fake's request
log, while the fake does see an Authorization header on every request.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import stat
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatstate import Chat, ModelError, make_adapter, open_store
from chatstate.testing import FakeModel

CLI = [sys.executable, "-m", "chatstate"]


pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")


@pytest.fixture
def canary() -> str:
    # Not shaped like "sk-...": only the exact-secret redaction can catch it.
    return "cnry" + secrets.token_hex(16)


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as model:
        yield model


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there any more


def store_url(kind: str, root: Path) -> str:
    return f"json://{root}" if kind == "json" else f"sqlite://{root}/chat.db"


def assert_not_in_store(root: Path, canary: str) -> None:
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files, f"nothing was written under {root}"
    for path in files:
        assert canary.encode() not in path.read_bytes(), f"the API key landed in {path}"


def assert_private(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_dir():
            assert mode == 0o700, f"{path} is {mode:o}, not 700"
        elif path.suffix in (".json", ".db"):  # transcripts
            assert mode == 0o600, f"{path} is {mode:o}, not 600"


def assert_fake_saw_key_but_kept_none(fake: FakeModel, canary: str) -> None:
    log = fake.request_log
    chats = [e for e in log if e["path"] == "/v1/chat/completions"]
    assert chats
    assert all(e["authorization"] for e in chats)
    assert canary not in repr(log)


def chain_text(exc: BaseException) -> str:
    """Everything a traceback printer or error reporter would show."""
    parts = ["".join(traceback.format_exception(exc))]
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen), repr(seen.args)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


# -- through the CLI -----------------------------------------------------------------------

SOURCES = [
    ("env", "CHATSTATE_API_KEY", "json"),
    ("env", "OPENAI_API_KEY", "sqlite"),
    ("dotenv", "CHATSTATE_API_KEY", "sqlite"),
    ("dotenv", "OPENAI_API_KEY", "json"),
]


@pytest.mark.invariant(9)
@pytest.mark.parametrize(("where", "variable", "kind"), SOURCES)
def test_cli_never_shows_or_stores_the_key(tmp_path: Path, fake: FakeModel, canary: str,
                                           where: str, variable: str, kind: str) -> None:
    root = tmp_path / "store"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    env["CHATSTATE_MAX_RETRIES"] = "0"
    if where == "env":
        env[variable] = canary
    else:
        (cwd / ".env").write_text(f"{variable}={canary}\n")

    def ask(base_url: str, *extra: str) -> subprocess.CompletedProcess[str]:
        args = [*CLI, "--store", store_url(kind, root), "--debug", *extra, "ask",
                "--base-url", base_url, "--id", "secret-test", "hello"]
        return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=60)

    ok = ask(fake.base_url)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("Echo: hello")
    fake.fail_next(401, message=f"Incorrect API key provided: {canary}. Header was "
                                f"'Authorization: Bearer {canary}'.")
    denied = ask(fake.base_url, "--log-format", "json")
    assert denied.returncode == 1
    assert "401" in denied.stderr
    assert "Traceback" in denied.stderr  # --debug really printed the chain
    refused = ask(closed_port_url())
    assert refused.returncode == 1
    assert "connect" in refused.stderr

    for run in (ok, denied, refused):
        assert canary not in run.stdout + run.stderr
    assert_not_in_store(root, canary)
    assert_fake_saw_key_but_kept_none(fake, canary)
    assert_private(root)


# -- through the library -------------------------------------------------------------------

@pytest.mark.invariant(9)
@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_library_errors_logs_and_store_never_hold_the_key(
        tmp_path: Path, fake: FakeModel, canary: str, kind: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, the HTTP stack's included
    root = tmp_path / "store"
    store = open_store(store_url(kind, root))

    def chat(base_url: str, **kwargs: Any) -> Chat:
        return Chat(store, conversation_id="secret-test", adapter=make_adapter(
            base_url=base_url, api_key=canary, max_retries=0, **kwargs))

    good = chat(fake.base_url)
    good.send("plain")
    "".join(good.stream("streamed"))
    texts = [repr(good.adapter), repr(good.adapter.backend), repr(good.messages)]

    fake.fail_next(401, message=f"Incorrect API key provided: {canary}")
    with pytest.raises(ModelError) as denied:
        chat(fake.base_url).send("denied")
    assert denied.value.status == 401
    fake.cut_stream_next(after_chunks=1)
    with pytest.raises(ModelError) as cut:
        "".join(chat(fake.base_url).retry_stream())
    with pytest.raises(ModelError) as refused:
        chat(closed_port_url()).retry()
    with pytest.raises(ModelError) as timed_out:
        fake.hang_next(2)
        chat(fake.base_url, timeout=0.2).retry()
    store.close()

    for failure in (denied, cut, refused, timed_out):
        texts.append(chain_text(failure.value))
        texts.append(repr(failure.value.provider_message))
    texts.append(caplog.text)
    for text in texts:
        assert canary not in text
    assert_not_in_store(root, canary)
    assert_fake_saw_key_but_kept_none(fake, canary)


@pytest.mark.invariant(9)
def test_a_canary_key_never_appears_in_drill_output_or_its_store(tmp_path: Path) -> None:
    """The drill's writers inherit the environment (and a .env in the cwd): nothing of the
    key may reach its table, its JSON, its logs or the store it drilled."""
    canary = "sk-canary-drill-" + secrets.token_hex(8)
    work = tmp_path / "cwd"
    work.mkdir()
    (work / ".env").write_text(f"OPENAI_API_KEY={canary}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    env["CHATSTATE_API_KEY"] = canary
    store = tmp_path / "store"
    for fmt in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "chatstate", "--debug", "--store", f"json://{store}",
             "drill", "--trials", "4", "--seed", "3", *fmt],
            capture_output=True, text=True, cwd=work, env=env, timeout=180)
        assert done.returncode == 0, done.stderr
        assert canary not in done.stdout
        assert canary not in done.stderr
    for path in store.rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path


# -- the encryption key (issue 25) ---------------------------------------------------------

@pytest.mark.invariant(9)
@pytest.mark.parametrize("source", ["env", "file", "command"])
def test_the_encryption_key_is_never_shown_or_stored(tmp_path: Path, fake: FakeModel,
                                                     source: str) -> None:
    from chatstate.stores.codec import new_key

    key, other = new_key(), new_key()
    root = tmp_path / "store"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    env["CHATSTATE_API_KEY"] = "sk-test-" + secrets.token_hex(8)
    if source == "env":
        env["CHATSTATE_ENCRYPTION_KEY"] = key
    elif source == "file":
        env["CHATSTATE_KEY_FILE"] = str(key_file)
    else:
        env["CHATSTATE_KEY_COMMAND"] = f"cat {key_file}"
    url = store_url("sqlite", root)

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "--store", url, "--debug", *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=60)

    runs = [cli("ask", "--base-url", fake.base_url, "--id", "sealed", "private words")]
    assert runs[0].returncode == 0, runs[0].stderr
    runs += [cli("replay", "sealed", "--verify"), cli("doctor", "--json"),
             cli("list", CHATSTATE_ENCRYPTION_KEY=other, CHATSTATE_KEY_FILE="",
                 CHATSTATE_KEY_COMMAND="")]
    assert runs[1].returncode == 0 and "authentication tag checked" in runs[1].stderr
    assert runs[3].returncode == 1 and "wrong encryption key" in runs[3].stderr
    for run in runs:
        for secret in (key, other, key[5:]):
            assert secret not in run.stdout + run.stderr
    assert_not_in_store(root, key[5:])
    assert_not_in_store(root, "private words")
