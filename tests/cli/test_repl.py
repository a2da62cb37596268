"""The chat REPL under a pseudo-terminal (pexpect), as a person would use it.

`chatstate chat --model fake` runs the built-in fake model in-process with a
10 ms pause between stream chunks; CHATSTATE_FAKE_REPLY_WORDS makes its replies
long enough (about two seconds) for a Ctrl-C to land mid-reply. HOME and the
XDG directories point under tmp_path, so the input history lands there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from support.cli_helpers import (
    API_KEY,
    HOSTILE,
    HOSTILE_SHOWN,
    RAW_CONTROLS,
    ReplSession,
    cli_env,
    invoke,
    replay_json,
)

from chatstate.testing import FakeModel, reply_text

WORDS = 200
UP = "\x1b[A"


@pytest.fixture
def sessions() -> Iterator[list[ReplSession]]:
    """REPLs started by a test; any still running at the end are killed."""
    started: list[ReplSession] = []
    yield started
    for repl in started:
        repl.close()


def start(sessions: list[ReplSession], store: str, env: dict[str, str],
          *args: str) -> ReplSession:
    repl = ReplSession(store, env, *args)
    sessions.append(repl)
    return repl


def interrupt_mid_reply(repl: ReplSession, prompt: str) -> str:
    """Send ``prompt``, Ctrl-C once a few words of the reply are on screen; the shown text."""
    repl.child.sendline(prompt)
    repl.child.expect(f"assistant> Echo: {prompt}( \\w+){{3}}")
    repl.child.sendintr()
    repl.child.expect(r"\[interrupted: the partial reply is kept; /retry completes the turn\]")
    shown, end, _ = repl.raw.split("assistant> ")[-1].partition("\r\n[interrupted")
    assert end, repr(shown)  # the Ctrl-C is not echoed (issue 28): the notice ends it
    return shown


@pytest.mark.invariant(2)
def test_ctrl_c_keeps_the_partial_and_retry_completes_it(
        local_store_url: str, tmp_path: Path, sessions: list[ReplSession]) -> None:
    """A streamed reply appears; Ctrl-C mid-reply keeps what arrived (everything shown is a
    prefix of the stored partial) and the REPL carries on; /retry completes the same turn;
    Ctrl-D exits 0."""
    s = local_store_url
    repl = start(sessions, s, cli_env(tmp_path, CHATSTATE_FAKE_REPLY_WORDS=str(WORDS)),
                 "--id", "r")
    assert "conversation r · model fake · /help for commands" in repl.prompt()
    shown = interrupt_mid_reply(repl, "tell me a long story")
    repl.prompt()

    partial = replay_json(s, "r")["messages"][-1]  # read while the REPL is still running
    assert (partial["role"], partial["status"]) == ("assistant", "partial")
    assert partial["content"].startswith(shown)
    assert len(shown) > len("Echo: ")
    history = repl.command("/history", r"assistant \(partial\)> Echo: tell me[^\r]*\r\n")
    assert "user> tell me a long story" in history

    full = reply_text([{"role": "user", "content": "tell me a long story"}], WORDS)
    repl.command("/retry", "assistant> " + full.replace(" ", "[ ]") + "\r\n")
    assert "nothing to retry" in repl.command("/retry", "nothing to retry[^\r]*")
    assert repl.eof() == 0
    assert repl.raw.rstrip().endswith("bye")

    messages = replay_json(s, "r")["messages"]
    assert [(m["role"], m["status"]) for m in messages] == [
        ("user", "complete"), ("assistant", "partial"), ("assistant", "complete")]
    assert messages[1]["content"] == partial["content"]
    assert messages[2]["content"] == full
    assert len({m["turn_id"] for m in messages}) == 1


@pytest.mark.invariant(7)
def test_resume_says_the_turn_was_interrupted_and_history_survives_restart(
        tmp_path: Path, sessions: list[ReplSession]) -> None:
    """`chat -c` shows the last turns, says plainly that the last turn was interrupted and how
    to finish it; Up recalls a line typed in the previous REPL (history file under HOME)."""
    s = f"json://{tmp_path}/store"
    env = cli_env(tmp_path, CHATSTATE_FAKE_REPLY_WORDS=str(WORDS))
    first = start(sessions, s, env)
    first.prompt()
    first.command("/title remembered across restarts", "title: remembered across restarts")
    interrupt_mid_reply(first, "what happened next")
    first.prompt()
    assert first.eof() == 0
    history_file = tmp_path / "home" / "state" / "chatstate" / "history"
    assert "what happened next" in history_file.read_text()

    second = start(sessions, s, env, "-c")
    greeting = second.prompt()
    assert "user> what happened next" in greeting
    assert "! the last turn was interrupted: the reply to turn t-" in greeting
    assert "(kept as partial). Type /retry to complete it." in greeting
    assert "partial reply so far: Echo: what happened next" in greeting
    second.child.send(UP)  # the previous session's last line
    second.child.expect("what happened next")
    second.child.send(UP)  # and the one before it, which Enter runs again
    second.child.send("\r")
    second.child.expect("title: remembered across restarts")
    second.prompt()
    second.command("/retry", r"assistant> Echo: what happened next[^\r]*\r\n")
    assert second.eof() == 0
    cid = invoke(["list", "--json"], store=s).json()[0]["id"]
    assert replay_json(s, cid)["messages"][-1]["status"] == "complete"


def test_slash_commands(local_store_url: str, tmp_path: Path,
                        sessions: list[ReplSession]) -> None:
    s = local_store_url
    repl = start(sessions, s, cli_env(tmp_path), "--id", "cmds")
    repl.prompt()
    assert "/retry           complete the interrupted turn" in repl.command(
        "/help", r"/exit {12}leave \(or Ctrl-D\)")
    repl.command("hello", r"assistant> Echo: hello[^\r]*\r\n")
    repl.command("/title Bird facts", "title: Bird facts")
    assert "title: Bird facts" in repl.command("/title", r"title: [^\r]*\r\n")
    repl.command("/model other-model", r"model other-model\r\n")
    repl.command("/system Answer in French.", "system instruction stored")
    repl.command("after the switch", r"assistant> Echo: after the switch[^\r]*\r\n")
    history = repl.command("/history", r"assistant> Echo: after the switch[^\r]*\r\n")
    assert "system> Answer in French." in history
    assert "user> hello" in history
    export = tmp_path / "out" / "cmds.json"
    export.parent.mkdir()
    repl.command(f"/export {export}", f"exported to {export}")
    assert "needs FILE" in repl.command("/export", r"/export needs FILE[^\r]*")
    assert "unknown command '/bogus'" in repl.command("/bogus", r"/help lists them")
    fresh = repl.command("/new", r"new conversation c-[\w-]+")
    new_id = fresh.split("new conversation ")[1].split()[0]
    repl.command("in the new one", r"assistant> Echo: in the new one[^\r]*\r\n")
    repl.child.sendline("/exit")
    repl.child.expect(pexpect.EOF)
    repl.child.close()
    assert repl.child.exitstatus == 0

    doc = replay_json(s, "cmds")
    assert doc["title"] == "Bird facts"
    assert [(m["role"], m["content"].split(" ")[:2]) for m in doc["messages"]] == [
        ("user", ["hello"]), ("assistant", ["Echo:", "hello"]),
        ("system", ["Answer", "in"]), ("user", ["after", "the"]),
        ("assistant", ["Echo:", "after"])]
    assert doc["messages"][1]["model"] == "fake"
    assert doc["messages"][4]["model"] == "other-model"
    exported = json.loads(export.read_text())
    assert [m["hash"] for m in exported["messages"]] == [m["hash"] for m in doc["messages"]]
    assert replay_json(s, new_id)["messages"][0]["content"] == "in the new one"


def test_hostile_text_is_neutralised_in_the_repl(tmp_path: Path,
                                                 sessions: list[ReplSession]) -> None:
    """Stored escapes are shown inert on resume, in /history and in a streamed reply."""
    s = f"sqlite://{tmp_path}/s.db"
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps([{"role": "user", "content": HOSTILE}]))
    cid = invoke(["import", str(path)], store=s).out.strip()  # an unanswered hostile turn
    repl = start(sessions, s, cli_env(tmp_path), "--id", cid)
    greeting = repl.prompt()
    visible = HOSTILE_SHOWN
    assert f"user> {visible}" in greeting
    assert "Type /retry" in greeting
    streamed = repl.command("/retry", r"assistant> Echo: [^\r]*\r\n")
    assert f"assistant> Echo: {visible}" in streamed
    repl.command("/history", r"assistant> Echo: [^\r]*\r\n")
    assert repl.eof() == 0
    for raw in RAW_CONTROLS:
        assert raw not in repl.raw, repr(raw)
    stored = replay_json(s, cid)["messages"]
    assert stored[0]["content"] == HOSTILE
    assert stored[1]["content"].startswith("Echo: " + HOSTILE)


def test_repl_without_a_terminal_reads_lines_from_stdin(tmp_path: Path) -> None:
    """Piped input: no prompt_toolkit, one line per message or command, EOF ends it."""
    s = f"json://{tmp_path}/s"
    for extra in ([], ["--no-stream"]):
        result = invoke(["chat", "--model", "fake", "--id", "piped", *extra], store=s,
                        input="hello\n/title piped\n")
        assert result.code == 0, result.err
        assert "assistant> Echo: hello" in result.out
        assert "title: piped" in result.err
        assert result.err.rstrip().endswith("bye")
    assert len(replay_json(s, "piped")["messages"]) == 4


@pytest.mark.invariant(1)
def test_a_model_error_keeps_the_repl_alive_and_retry_completes(tmp_path: Path) -> None:
    """A failing model call is one error line; the message is stored; /retry finishes it."""
    s = f"sqlite://{tmp_path}/s.db"
    with FakeModel() as fake:
        fake.fail_next(503)
        result = invoke(["chat", "--base-url", fake.base_url, "--model", "fake-model", "--id",
                         "e"], store=s, input="will fail\n/retry\n",
                        env={"CHATSTATE_API_KEY": API_KEY, "CHATSTATE_MAX_RETRIES": "0"})
    assert result.code == 0, result.err
    assert "error: model request to " in result.err
    assert "HTTP 503" in result.err
    assert "[your message is stored; /retry completes the turn]" in result.err
    assert result.out.rstrip().endswith(
        "assistant> " + reply_text([{"role": "user", "content": "will fail"}]))
    messages = replay_json(s, "e")["messages"]
    assert [(m["role"], m["status"]) for m in messages] == [("user", "complete"),
                                                            ("assistant", "complete")]
