"""`chatstate ask`, the global contract (store line, exit codes, errors), the guard and the demo.

Everything goes through the real entry point: ``invoke`` (``common.run`` in
this process) or the installed ``chatstate`` script as a subprocess. The model
is the package's fake, in-process (``--model fake``) or as a ``chatstate
fake-server`` subprocess scripted over HTTP.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from support.cli_helpers import (
    API_KEY,
    CHATSTATE,
    HOSTILE,
    HOSTILE_SHOWN,
    RAW_CONTROLS,
    cli_env,
    invoke,
    replay_json,
    run_cli,
    strip_ansi,
)

from chatstate.core.transcript import Message, verify_chain
from chatstate.durable.guard import inspect
from chatstate.testing import FakeControl, reply_text

CONTROL = ("\x1b", "\x07", "\x00", "\r", "\x9b", "\u202e")


def expected_reply(*turns: tuple[str, str]) -> str:
    """What the fake answers to this history (role, content pairs)."""
    return reply_text([{"role": role, "content": content} for role, content in turns])


def ids(store: str) -> list[str]:
    return [row["id"] for row in invoke(["list", "--json"], store=store).json()]


# -- ask: input, output, streams ---------------------------------------------------------

def test_ask_streams_only_the_reply_on_stdout(local_store_url: str, tmp_path: Path) -> None:
    """A real process: stdout is exactly the reply; the store line and the id go to stderr,
    and the store line names the store, its filesystem and the verdict."""
    result = run_cli(["ask", "--model", "fake", "hello there"], cli_env(tmp_path),
                     store=local_store_url)
    assert result.code == 0, result.err
    assert result.out == expected_reply(("user", "hello there")) + "\n"
    report = inspect(tmp_path)
    lines = result.err.splitlines()
    assert lines[0] == f"store {local_store_url} on {report.fstype} {report.source}: " \
                       f"{report.verdict}"
    assert report.fstype
    assert report.verdict == "durable"
    cid = lines[1].removeprefix("conversation ")
    doc = replay_json(local_store_url, cid)
    assert [(m["seq"], m["role"], m["status"]) for m in doc["messages"]] == [
        (0, "user", "complete"), (1, "assistant", "complete")]
    assert doc["messages"][1]["content"] == result.out[:-1]


@pytest.mark.parametrize("args", [["-"], []], ids=["dash", "absent"])
def test_ask_reads_stdin(local_store_url: str, args: list[str]) -> None:
    """PROMPT '-' or absent reads stdin; the text is stored as piped, less the one newline
    that ends it (as a shell's $(...) drops it)."""
    piped, prompt = "from stdin\nsecond line\n", "from stdin\nsecond line"
    result = invoke(["ask", "--model", "fake", "--id", "piped", *args],
                    store=local_store_url, input=piped)
    assert result.code == 0, result.err
    assert result.out == expected_reply(("user", prompt)) + "\n"
    assert replay_json(local_store_url, "piped")["messages"][0]["content"] == prompt


def test_ask_no_stream_and_json(local_store_url: str) -> None:
    """--no-stream prints the whole reply; --json one object with id, seqs, reply, usage."""
    plain = invoke(["ask", "--model", "fake", "--id", "j", "--no-stream", "first"],
                   store=local_store_url)
    assert plain.code == 0, plain.err
    assert plain.out == expected_reply(("user", "first")) + "\n"
    second = invoke(["ask", "--model", "fake", "--id", "j", "--json", "second"],
                    store=local_store_url)
    assert second.code == 0, second.err
    data = second.json()
    assert data["conversation_id"] == "j"
    assert (data["user_seq"], data["reply_seq"]) == (2, 3)
    assert data["reply"] == expected_reply(("user", "first"), ("assistant", plain.out[:-1]),
                                           ("user", "second"))
    assert data["usage"]["total_tokens"] == (data["usage"]["prompt_tokens"]
                                             + data["usage"]["completion_tokens"]) > 0
    stored = replay_json(local_store_url, "j")["messages"]
    assert stored[3]["content"] == data["reply"]
    assert stored[3]["turn_id"] == data["turn_id"]


def test_ask_id_creates_then_continues_and_c_continues_latest(local_store_url: str) -> None:
    s = local_store_url
    assert invoke(["ask", "--model", "fake", "--id", "older", "one"], store=s).code == 0
    assert invoke(["ask", "--model", "fake", "--id", "newer", "two"], store=s).code == 0
    again = invoke(["ask", "--model", "fake", "--id", "older", "three"], store=s)
    assert again.code == 0
    assert "conversation older" in again.err
    assert [m["content"] for m in replay_json(s, "older")["messages"][::2]] == ["one", "three"]
    # "older" was updated last, so -c continues it
    cont = invoke(["ask", "--model", "fake", "-c", "--json", "four"], store=s)
    assert cont.code == 0, cont.err
    assert cont.json()["conversation_id"] == "older"
    assert cont.json()["user_seq"] == 4
    assert sorted(ids(s)) == ["newer", "older"]


def test_ask_system_prompt_reaches_the_model(local_store_url: str) -> None:
    result = invoke(["ask", "--model", "fake", "--id", "sys", "--system", "Be terse.", "hi"],
                    store=local_store_url)
    assert result.code == 0, result.err
    assert result.out[:-1] == expected_reply(("system", "Be terse."), ("user", "hi"))
    first = replay_json(local_store_url, "sys")["messages"][0]
    assert (first["seq"], first["role"], first["content"]) == (0, "system", "Be terse.")


def test_a_system_prompt_for_a_stored_conversation_is_said_to_be_not_applied(
        local_store_url: str) -> None:
    # it was dropped without a word: the user thought the model had it
    first = invoke(["ask", "--model", "fake", "--id", "sys", "--system", "Be terse.", "hi"],
                   store=local_store_url)
    assert first.code == 0, first.err
    same = invoke(["ask", "--model", "fake", "--id", "sys", "--system", "Be terse.", "again"],
                  store=local_store_url)
    assert same.code == 0 and "not applied" not in same.err  # a script's usual call
    other = invoke(["ask", "--model", "fake", "--id", "sys", "--system", "Be kind.", "more"],
                   store=local_store_url)
    assert other.code == 0, other.err
    assert "sys has 5 message(s), so it was not applied" in other.err
    system = [m["content"] for m in replay_json(local_store_url, "sys")["messages"]
              if m["role"] == "system"]
    assert system == ["Be terse."]


def test_offline_says_that_a_model_given_is_not_used(local_store_url: str) -> None:
    result = invoke(["ask", "--offline", "--model", "gpt-4o", "--id", "o", "hi"],
                    store=local_store_url)
    assert result.code == 0, result.err
    assert "--model gpt-4o is not used" in result.err  # it was dropped without a word
    assert replay_json(local_store_url, "o")["messages"][-1]["model"] == "fake"
    quiet = invoke(["ask", "--offline", "--id", "o2", "hi"], store=local_store_url)
    assert "not used" not in quiet.err


# -- exit codes and errors ---------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["ask", "--id", "x", "-c", "hi"],
    ["ask", "--retry"],
    ["ask", "--retry", "--id", "x", "a prompt too"],
    ["ask", "--no-such-option"],
    ["nonsense-command"],
], ids=["id-and-c", "retry-without-id", "retry-with-prompt", "bad-option", "bad-command"])
def test_usage_errors_exit_2_before_the_store_opens(tmp_path: Path, args: list[str]) -> None:
    store = f"json://{tmp_path}/never"
    result = invoke(args, store=store)
    assert result.code == 2, result
    assert "store " not in result.err
    assert not (tmp_path / "never").exists()


def test_empty_and_undecodable_prompts_are_refused(tmp_path: Path) -> None:
    """Exit 2 and nothing stored: not an empty prompt, not bytes that are not UTF-8."""
    store = f"json://{tmp_path}/s"
    env = cli_env(tmp_path)
    assert invoke(["ask", "--model", "fake"], store=store, input="  \n").code == 2
    bad = run_cli(["ask", "--model", "fake", "--id", "b", "-"], env, store=store,
                  input=b"caf\xe9\n")
    assert bad.code == 2, bad.err
    assert "not valid UTF-8 (byte 0xe9" in bad.err, bad.err
    assert "Traceback" not in bad.err
    assert invoke(["list", "--json"], store=store).json() == []


def test_continue_with_nothing_to_continue_exits_1(tmp_path: Path) -> None:
    result = invoke(["ask", "--model", "fake", "-c", "hi"], store=f"sqlite://{tmp_path}/s.db")
    assert result.code == 1
    assert "no conversation to continue" in result.err
    assert "--new" in result.err


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeControl]:
    """`chatstate fake-server` in its own process, scripted over HTTP."""
    env = cli_env(tmp_path_factory.mktemp("fake-server"))
    proc = subprocess.Popen([CHATSTATE, "fake-server", "--port", "0", "--reply-words", "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else url
        yield FakeControl(url)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.invariant(1)
def test_model_error_is_one_paragraph_then_retry_completes_the_turn(
        local_store_url: str, tmp_path: Path, fake_server: FakeControl) -> None:
    """A 500 (retries off) exits 1 with one paragraph that says how to finish the turn; the
    user message is stored as an interrupted turn; `ask --retry` completes it under the same
    turn id; --debug adds the traceback."""
    fake_server.reset()
    env = cli_env(tmp_path, CHATSTATE_API_KEY=API_KEY, CHATSTATE_MAX_RETRIES="0")
    model = ["--base-url", fake_server.base_url, "--model", "fake-model"]
    fake_server.fail_next(500)
    failed = run_cli(["ask", "--id", "e", *model, "will fail"], env, store=local_store_url)
    assert failed.code == 1
    assert failed.out == ""
    errors = [line for line in failed.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert failed.err.rstrip().endswith(errors[0])
    assert "HTTP 500" in errors[0]
    assert "chatstate ask --id e --retry" in errors[0]
    assert "Traceback" not in failed.err
    assert API_KEY not in failed.err
    messages = replay_json(local_store_url, "e")["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [("user", "will fail")]

    retried = run_cli(["ask", "--id", "e", "--retry", *model], env, store=local_store_url)
    assert retried.code == 0, retried.err
    assert retried.out[:-1] == reply_text([{"role": "user", "content": "will fail"}], 6)
    messages = replay_json(local_store_url, "e")["messages"]
    assert [(m["role"], m["status"]) for m in messages] == [("user", "complete"),
                                                            ("assistant", "complete")]
    assert messages[0]["turn_id"] == messages[1]["turn_id"]

    fake_server.fail_next(500)
    debug = run_cli(["--debug", "ask", "--id", "e", *model, "again"], env,
                    store=local_store_url)
    assert debug.code == 1
    assert "Traceback (most recent call last)" in debug.err
    assert "ModelError" in debug.err
    assert API_KEY not in debug.err


@pytest.mark.invariant(2, 7)
def test_sigkill_mid_stream_leaves_a_partial_that_retry_completes(
        local_store_url: str, tmp_path: Path) -> None:
    """kill -9 an `ask` mid-reply: what it printed is a prefix of the stored partial; replay
    shows it as a trailing partial message and says how to retry; `ask --retry` commits the
    partial into the chain and adds the complete reply under the same turn id."""
    env = cli_env(tmp_path, CHATSTATE_FAKE_REPLY_WORDS="300")
    child = subprocess.Popen([CHATSTATE, "--store", local_store_url, "ask", "--model", "fake",
                              "--id", "k", "tell me everything"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env)
    assert child.stdout is not None
    shown = b""
    while len(shown) < 40:
        chunk = os.read(child.stdout.fileno(), 64)
        assert chunk, "the writer ended before it was killed"
        shown += chunk
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()

    replay = invoke(["replay", "k", "--format", "json"], store=local_store_url)
    assert "the last turn was interrupted" in replay.err
    assert "--retry" in replay.err
    messages = replay.json()["messages"]
    assert [(m["role"], m["status"]) for m in messages] == [("user", "complete"),
                                                            ("assistant", "partial")]
    partial = messages[1]["content"]
    assert partial.startswith(shown.decode())
    assert len(partial) < 2000

    done = invoke(["ask", "--id", "k", "--retry", "--model", "fake", "--no-stream"],
                  store=local_store_url, env={"CHATSTATE_FAKE_REPLY_WORDS": "300"})
    assert done.code == 0, done.err
    messages = replay_json(local_store_url, "k")["messages"]
    assert [(m["role"], m["status"]) for m in messages] == [
        ("user", "complete"), ("assistant", "partial"), ("assistant", "complete")]
    assert messages[1]["content"] == partial
    assert messages[2]["content"].startswith(partial)
    assert messages[2]["content"] == done.out[:-1]
    assert len({m["turn_id"] for m in messages}) == 1
    assert verify_chain([Message.model_validate(m) for m in messages]) is None
    nothing = invoke(["ask", "--id", "k", "--retry", "--model", "fake"], store=local_store_url)
    assert nothing.code == 1
    assert "has no interrupted turn to retry" in nothing.err


@pytest.mark.invariant(2)
def test_reader_going_away_keeps_the_partial_and_says_how_to_retry(tmp_path: Path) -> None:
    """`chatstate ask ... | head -c 20`: the reply is cut where the reader left, exit 1, and
    stderr says how to complete the turn."""
    store = f"sqlite://{tmp_path}/s.db"
    env = cli_env(tmp_path, CHATSTATE_FAKE_REPLY_WORDS="2000")
    child = subprocess.Popen([CHATSTATE, "--store", store, "ask", "--model", "fake", "--id",
                              "pipe", "hi"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env)
    assert child.stdout is not None
    assert child.stderr is not None
    head = child.stdout.read(20)
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=30) == 1
    assert "complete the turn with `chatstate ask --id pipe --retry`" in err
    assert "Traceback" not in err
    assert "Exception ignored" not in err
    last = replay_json(store, "pipe")["messages"][-1]
    assert last["status"] == "partial"
    assert last["content"].startswith(head.decode())


# -- the durability guard through the CLI ------------------------------------------------

@pytest.fixture
def shm_dir() -> Iterator[Path]:
    if not Path("/dev/shm").is_dir():
        pytest.skip(reason="no /dev/shm on this machine")
    path = Path("/dev/shm") / f"chatstate-cli-test-{uuid.uuid4().hex[:8]}"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.invariant(8)
def test_ephemeral_store_is_refused_unless_allowed(shm_dir: Path, tmp_path: Path) -> None:
    store = f"json://{shm_dir}/store"
    env = cli_env(tmp_path)
    refused = run_cli(["ask", "--model", "fake", "hi"], env, store=store)
    assert refused.code == 1
    assert refused.out == ""
    assert refused.err.startswith("error: refusing store json:///dev/shm/")
    assert "CHATSTATE_STORE (or --store)" in refused.err      # fix 1: durable storage
    assert "--allow-ephemeral" in refused.err                 # fix 2: accept the loss
    assert "Traceback" not in refused.err
    assert not shm_dir.exists(), "the guard must refuse before the first write"

    # the demo, whose second writer is a process of its own, honours the flag too
    allowed = run_cli(["--allow-ephemeral", "demo"], env, store=store)
    assert allowed.code == 0, allowed.err
    assert allowed.first_err_line.startswith(f"store {store} on tmpfs ")
    assert ": ephemeral" in allowed.first_err_line
    assert "everything the writer rendered is a prefix of it: yes" in allowed.err
    by_env = run_cli(["list"], dict(env, CHATSTATE_ALLOW_EPHEMERAL="1"), store=store)
    assert by_env.code == 0
    assert by_env.out.count("msgs") == 1


# -- the demo ------------------------------------------------------------------------------

def test_demo_runs_green_and_says_what_it_proved(tmp_path: Path) -> None:
    store = f"sqlite://{tmp_path}/demo.db"
    result = run_cli(["demo"], cli_env(tmp_path, CHATSTATE_STORE=store))
    assert result.code == 0, result.err
    assert result.first_err_line.startswith(f"store {store} on ")
    assert "everything the writer rendered is a prefix of it: yes" in result.err
    assert "hash chain verified" in result.err
    assert "<SIGKILL>" in result.out
    cid = result.err.split("chatstate replay ")[1].split()[0]
    verified = invoke(["replay", cid, "--verify"], store=store)
    assert verified.code == 0
    assert "chain intact" in verified.err
    roles = [(m["role"], m["status"]) for m in replay_json(store, cid)["messages"]]
    assert ("assistant", "partial") in roles
    assert roles[-1] == ("assistant", "complete")


# -- hostile model output --------------------------------------------------------------------

def test_hostile_reply_is_stored_exactly_and_neutralised_in_text(local_store_url: str,
                                                                 tmp_path: Path) -> None:
    """The fake echoes the prompt, so escapes in the prompt come back in the reply. JSON holds
    them byte for byte; text and markdown replay, list and search show them inert; ask
    writing to a pipe passes them through untouched (a script gets what the model said)."""
    s = local_store_url
    # a real process: click's test runner would turn the "\r" on stdin into "\n"
    result = run_cli(["ask", "--model", "fake", "--id", "h", "-"], cli_env(tmp_path), store=s,
                     input=HOSTILE)
    assert result.code == 0, result.err
    reply = expected_reply(("user", HOSTILE))
    assert result.out == reply + "\n"
    messages = replay_json(s, "h")["messages"]
    assert [m["content"] for m in messages] == [HOSTILE, reply]
    for fmt in ("text", "markdown"):
        shown = invoke(["replay", "h", "--format", fmt], store=s).out
        assert not any(c in shown for c in CONTROL), (fmt, shown)
        assert HOSTILE_SHOWN in shown
    for args in (["list"], ["search", "pwned"]):
        listed = invoke(args, store=s).out
        assert "pwned" in listed, (args, listed)
        assert not any(c in listed for c in CONTROL), (args, listed)
    jsonl = invoke(["replay", "h", "--format", "jsonl"], store=s).out
    assert not any(c in jsonl for c in CONTROL)
    assert "\\u009b" in jsonl


def test_hostile_reply_is_neutralised_by_ask_on_a_tty(tmp_path: Path) -> None:
    """On a terminal `ask` makes control characters visible; the store keeps them."""
    store = f"json://{tmp_path}/s"
    (tmp_path / "prompt.txt").write_text(HOSTILE)
    child = pexpect.spawn("/bin/sh", ["-c", f"exec {CHATSTATE} --store {store} ask --model "
                                            f"fake --id tty - < {tmp_path}/prompt.txt"],
                          env=cli_env(tmp_path), encoding="utf-8", timeout=20)
    child.expect(pexpect.EOF)
    child.close()
    raw = child.before
    assert child.exitstatus == 0, raw
    # Markdown is rendered on a terminal: the only escapes are the renderer's own styling
    assert f"Echo: {HOSTILE_SHOWN}" in strip_ansi(raw)
    assert not any(c in raw for c in RAW_CONTROLS), repr(raw)
    assert "\x1b" not in strip_ansi(raw), repr(raw)
    assert replay_json(store, "tty")["messages"][1]["content"] == expected_reply(
        ("user", HOSTILE))


def test_help_lists_every_command_without_heavy_imports(tmp_path: Path) -> None:
    """`chatstate --help` stays fast by importing no model, store or pydantic code (the time
    itself is measured for the README, not asserted)."""
    result = run_cli(["--help"], cli_env(tmp_path))
    assert result.code == 0
    for name in ("chat", "ask", "list", "replay", "export", "import", "rm", "prune", "search",
                 "demo"):
        assert f"  {name} " in result.out
    code = ("import sys\nfrom chatstate.cli import main\nsys.argv = ['chatstate', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('pydantic', 'openai', 'httpx', 'httpx2', 'sqlite3', "
            "'prompt_toolkit', 'chatstate.session') if m in sys.modules]\n"
            "print('HEAVY', heavy, file=sys.stderr)")
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=cli_env(tmp_path), check=False)
    assert "HEAVY []" in probe.stderr, probe.stderr


def test_ask_reading_from_a_terminal_says_so(tmp_path: Path) -> None:
    """With no PROMPT on a terminal, ask says it is reading and Ctrl-D ends the prompt."""
    child = pexpect.spawn(CHATSTATE, ["--store", f"json://{tmp_path}/s", "ask", "--model",
                                      "fake", "--id", "typed"], env=cli_env(tmp_path),
                          encoding="utf-8", timeout=20)
    child.expect("reading the prompt from the terminal; end it with Ctrl-D")
    child.send("typed in\n")
    child.sendeof()
    child.expect("Echo: typed in ")  # the newline that ended the typed text is dropped
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert replay_json(f"json://{tmp_path}/s", "typed")["messages"][0]["content"] == "typed in"
