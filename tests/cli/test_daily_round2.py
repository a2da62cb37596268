"""Daily driver, round 2: what a new user trips over (issue 28), each shown by a test."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

from support import ROOT
from support.cli_helpers import CHATSTATE, cli_env, invoke, replay_json, run_cli
from support.screen import screen_of

import chatstate
from chatstate.core.redact import REDACTED, scrub
from chatstate.testing import FakeModel

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# -- short keys do not garble messages ------------------------------------------------------


def test_a_one_letter_key_leaves_messages_readable() -> None:
    text = "model request failed: the server refused the request; check the key"
    assert scrub(text, "e") == text


def test_a_real_key_is_redacted_where_it_stands_as_a_token() -> None:
    key = "cnry0123456789abcdef"
    text = f"Incorrect API key provided: {key}. (Bearer {key}) x{key}y"
    shown = scrub(text, key)
    assert shown.count(REDACTED) == 2
    assert f"x{key}y" in shown  # inside a longer word it is some other value


def test_a_short_key_for_a_remote_endpoint_gets_a_warning_not_garbled_errors(
        tmp_path: Path) -> None:
    env = cli_env(tmp_path, CHATSTATE_API_KEY="e",
                  CHATSTATE_BASE_URL="http://chatstate-test.invalid:9/v1",
                  CHATSTATE_MAX_RETRIES="0")
    result = invoke(["ask", "hello"], store=f"json://{tmp_path}/s", env=env)
    assert result.code != 0
    assert REDACTED not in result.err, result.err
    assert "shorter than 8 characters" in result.err
    assert "no provider issues" in result.err


def test_a_short_key_for_a_local_server_is_not_warned_about(tmp_path: Path) -> None:
    with FakeModel(reply_words=3) as fake:
        env = cli_env(tmp_path, CHATSTATE_API_KEY="none", CHATSTATE_BASE_URL=fake.base_url)
        result = invoke(["ask", "hello"], store=f"json://{tmp_path}/s", env=env)
    assert result.code == 0, result.err
    assert "shorter than" not in result.err


# -- one version everywhere -----------------------------------------------------------------


def test_the_version_agrees_with_pyproject_and_the_changelog() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["hatch"]["version"]["path"] == "chatstate/_version.py"
    project = chatstate.__version__
    assert importlib.metadata.version("chatstate") == project  # what pip installed
    shown = invoke(["--version"]).out
    assert project in shown
    heading = next(line for line in (ROOT / "CHANGELOG.md").read_text().splitlines()
                   if line.startswith("## "))
    named = re.search(r"\d+\.\d+", heading)
    assert named is not None, heading
    assert project.startswith(named.group(0) + "."), (project, heading)



# -- the built-in fake is fast unless asked to be slow ----------------------------------------


def test_a_90kb_paste_to_the_fake_model_comes_back_at_once(tmp_path: Path) -> None:
    text = "word " * 18_000  # 90 KB: at the old 10 ms a chunk, three minutes of echo
    env = cli_env(tmp_path, CHATSTATE_FAKE_CHUNK_DELAY="")
    result = run_cli(["ask", "--model", "fake"], env, input=text,
                     store=f"json://{tmp_path}/s", timeout=60)
    assert result.code == 0, result.err
    assert result.out.startswith("Echo: word word")  # streamed: one chunk a word


def test_the_fake_pace_is_a_checked_setting(tmp_path: Path) -> None:
    env = cli_env(tmp_path, CHATSTATE_FAKE_CHUNK_DELAY="fast")
    result = invoke(["ask", "--model", "fake", "hi"], store=f"json://{tmp_path}/s", env=env)
    assert result.code == 2
    assert "CHATSTATE_FAKE_CHUNK_DELAY='fast' is not a delay in seconds" in result.err


# -- piped text beside a prompt --------------------------------------------------------------


def test_piped_text_follows_the_prompt(tmp_path: Path) -> None:
    env = cli_env(tmp_path, CHATSTATE_FAKE_REPLY_WORDS="0")
    result = run_cli(["ask", "--model", "fake", "--json", "Summarise:"], env,
                     input="line one\nline two\n", store=f"json://{tmp_path}/s")
    assert result.code == 0, result.err
    assert result.json()["reply"] == "Echo: Summarise:\n\nline one\nline two"


def test_a_prompt_with_nothing_piped_is_sent_alone(tmp_path: Path) -> None:
    env = cli_env(tmp_path, CHATSTATE_FAKE_REPLY_WORDS="0")
    result = run_cli(["ask", "--model", "fake", "--json", "just this"], env, input="",
                     store=f"json://{tmp_path}/s")
    assert result.code == 0, result.err
    assert result.json()["reply"] == "Echo: just this"


def test_too_much_piped_text_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    result = run_cli(["ask", "--model", "fake", "Summarise:"], env,
                     input="x" * (1024 * 1024 + 10), store=f"json://{tmp_path}/s")
    assert result.code == 2
    assert "over 1 MiB; nothing was sent or stored" in result.err
    assert not list((tmp_path / "s").glob("*.json"))


# -- attachments against a text-only local server (llama.cpp without a vision projector) -----


def test_a_text_file_reaches_a_text_only_server_as_text(tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("# Plan\n\n- ship it\n")
    with FakeModel(reply_words=0) as fake:
        fake.configure(text_only=True)
        env = cli_env(tmp_path, CHATSTATE_BASE_URL=fake.base_url, CHATSTATE_MODEL="m",
                      CHATSTATE_API_KEY="none")
        result = invoke(["ask", "Summarise:", "-a", str(notes)], store=f"json://{tmp_path}/s",
                        env=env)
    assert result.code == 0, result.err
    assert result.out.startswith('Echo: Summarise: <file name="notes.md">\n# Plan\n\n- ship it')


def test_an_image_to_a_model_without_vision_is_not_retried_and_says_why(
        tmp_path: Path) -> None:
    png = tmp_path / "red.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    with FakeModel() as fake:
        fake.configure(text_only=True)
        env = cli_env(tmp_path, CHATSTATE_BASE_URL=fake.base_url, CHATSTATE_MODEL="m",
                      CHATSTATE_API_KEY="none", CHATSTATE_BACKOFF_BASE="0.01")
        result = invoke(["ask", "what colour?", "-a", str(png)], store=f"json://{tmp_path}/s",
                        env=env)
        chats = [e for e in fake.request_log if e["path"] == "/v1/chat/completions"]
    assert result.code == 1
    assert len(chats) == 1  # the same request fails the same way: sent once
    assert "The model does not take images" in result.err
    assert "the provider is failing" not in result.err
    assert "--retry" not in result.err.split("does not take images", 1)[1].split(".")[0]
    assert "would fail the same way" in result.err


# -- batch progress on a real terminal (tmux: what the screen shows at the end) ---------------


def test_batch_progress_and_warnings_never_overprint_each_other(tmp_path: Path) -> None:
    records = tmp_path / "in.jsonl"
    records.write_text("".join(f'{{"id": "r{i}", "text": "t{i}"}}\n' for i in range(3)))
    env = cli_env(tmp_path, CHATSTATE_API_KEY="none", CHATSTATE_BACKOFF_BASE="0.2")
    command = (f"{CHATSTATE} --store json://{tmp_path}/s batch run {records} --prompt '{{text}}' "
               f"--out {tmp_path}/out --base-url http://127.0.0.1:9/v1 --model m")
    lines = [line for line in screen_of(command, tmp_path, env=env).splitlines() if line]
    assert not [line for line in lines if "━" in line], lines  # no bar left behind
    ledger = [line for line in lines if ".chatstate-batch.db" in line]
    assert len(ledger) == 1 and ledger[0].startswith("ledger "), lines
    warnings = [line for line in lines if "attempt" in line and "failed (connect)" in line]
    assert len(warnings) == 6, lines  # 3 records x 2 retries, each on a line of its own
    assert all(line.startswith("WARNING chatstate.adapter:") for line in warnings), lines
    assert any("--retry-failed" in line for line in lines), lines


# -- messages that said the wrong thing -------------------------------------------------------


def test_compact_with_nothing_to_compact_does_not_announce_a_summary(tmp_path: Path) -> None:
    result = invoke(["chat", "--model", "fake", "--id", "k"], store=f"json://{tmp_path}/s",
                    env=cli_env(tmp_path), input="hello\n/compact\n")
    assert result.code == 0, result.err
    assert "nothing to compact yet" in result.out + result.err
    assert "summarising" not in result.out + result.err


def test_compact_shows_the_summary_it_stored(tmp_path: Path) -> None:
    turns = "".join(f"turn {i}\n" for i in range(4))
    result = invoke(["chat", "--model", "fake", "--id", "k"], store=f"json://{tmp_path}/s",
                    env=cli_env(tmp_path), input=turns + "/compact\n")
    assert result.code == 0, result.err
    shown = result.out + result.err
    assert "summary stored at seq" in shown
    summary = replay_json(f"json://{tmp_path}/s", "k")["messages"][-1]
    assert summary["role"] == "system"
    assert summary["content"] in shown


def test_a_failure_text_ending_in_a_stop_gets_no_second_one() -> None:
    from chatstate.adapter._policy import AttemptFailed, to_model_error

    failure = AttemptFailed("cut", "the connection dropped: Server disconnected without "
                            "sending a response.", retryable=True)
    error = to_model_error(failure, attempts=1, endpoint="http://h/v1", secret=None,
                           timeout=None)
    assert ".." not in str(error)
    assert "response. Try again" not in str(error)
    assert "without sending a response. The connection dropped" in str(error)
