"""The daily driver under a real terminal (pexpect): Markdown, Ctrl-C mid-render, /compact,
/fork, /edit and a template. The model is the built-in fake (``--model fake``), whose
reply echoes the user's message, so a message with Markdown in it gets Markdown back.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli_helpers import (
    CHATSTATE,
    ReplSession,
    cli_env,
    invoke,
    replay_json,
    strip_ansi,
)

from chatstate.testing import reply_text

NEWLINE = "\x1b\r"  # Esc then Enter inserts a newline at the REPL prompt
HIDE, SHOW = "\x1b[?25l", "\x1b[?25h"


@pytest.fixture
def sessions() -> Iterator[list[ReplSession]]:
    started: list[ReplSession] = []
    yield started
    for repl in started:
        repl.close()


def start(sessions: list[ReplSession], store: str, env: dict[str, str], *args: str,
          markdown: bool = True) -> ReplSession:
    repl = ReplSession(store, env, *args, markdown=markdown)
    sessions.append(repl)
    repl.prompt()
    return repl


def words(text: str) -> str:
    return " ".join(text.split())


def test_markdown_reply_with_a_code_fence(local_store_url: str, tmp_path: Path,
                                          sessions: list[ReplSession]) -> None:
    """Bold is bold (no asterisks), the fence is a highlighted code block (no backticks),
    a dim token line follows; the store keeps the reply exactly as the model sent it."""
    repl = start(sessions, local_store_url, cli_env(tmp_path), "--id", "md")
    message = NEWLINE.join(["Here is code:", "```python", "print('hi')", "```", "",
                            "**bold** text"])
    repl.child.send(message + "\r")
    seen = repl.prompt()
    raw = repl.raw.split("**bold** text", 2)[-1]  # after the echo of the input line
    shown = strip_ansi(raw)
    assert "print('hi')" in shown
    assert "```" not in shown
    assert "**" not in shown
    assert re.search(r"\x1b\[1mbold\x1b\[0m", raw)  # bold
    assert re.search(r"\x1b\[[0-9;]*mprint\x1b\[0m", raw)  # the code is highlighted
    assert re.search(r"\x1b\[2m\d+ tokens · [\d.]+ tokens/s\x1b\[0m", raw), seen
    assert raw.rfind(SHOW) > raw.rfind(HIDE)  # the cursor is back
    stored = replay_json(local_store_url, "md")["messages"][-1]
    user = message.replace(NEWLINE, "\n")
    assert stored["content"] == reply_text([{"role": "user", "content": user}])


def test_quiet_and_raw(local_store_url: str, tmp_path: Path,
                       sessions: list[ReplSession]) -> None:
    """--quiet drops the token line; --raw prints the text exactly as stored, escapes and
    all neutralised, with no styling."""
    env = cli_env(tmp_path)
    quiet = start(sessions, local_store_url, env, "--id", "q", "--quiet")
    quiet.child.sendline("**hi**")
    assert "tokens/s" not in quiet.prompt()
    raw = start(sessions, local_store_url, env, "--id", "r", markdown=False)
    raw.child.sendline("**hi**")
    assert "assistant> Echo: **hi**" in raw.prompt()


def test_ctrl_c_mid_render_keeps_the_partial_and_the_screen_sane(
        local_store_url: str, tmp_path: Path, sessions: list[ReplSession]) -> None:
    """Ctrl-C while a Markdown block is being re-rendered: the REPL carries on, the cursor
    is shown again, what was on screen is a prefix of the stored partial, /retry completes."""
    repl = start(sessions, local_store_url,
                 cli_env(tmp_path, CHATSTATE_FAKE_REPLY_WORDS="300"), "--id", "c")
    repl.child.sendline("tell me a long story")
    repl.child.expect(r"Echo: tell me a long story( \w+){3}")
    repl.child.sendintr()
    repl.child.expect(r"\[interrupted: the partial reply is kept; /retry completes the turn\]")
    repl.prompt()
    raw = repl.raw.split("tell me a long story", 2)[-1]
    assert raw.rfind(SHOW) > raw.rfind(HIDE)
    last_frame = strip_ansi(raw.rsplit("\r\x1b[2K", 1)[-1]).split("^C")[0].split("[inter")[0]
    partial = replay_json(local_store_url, "c")["messages"][-1]
    assert (partial["role"], partial["status"]) == ("assistant", "partial")
    assert words(partial["content"]).startswith(words(last_frame))
    assert len(words(last_frame)) > len("Echo: tell me")
    repl.child.sendline("/retry")
    repl.prompt()
    done = replay_json(local_store_url, "c")["messages"]
    assert done[-1]["status"] == "complete"
    assert done[-2]["status"] == "partial"


def test_compact_fork_and_edit_in_the_repl(local_store_url: str, tmp_path: Path,
                                           sessions: list[ReplSession]) -> None:
    """/compact stores a summary (the turns stay); /fork continues in a copy; /edit asks
    again in a fork with new text. The original conversation is never rewritten."""
    s = local_store_url
    repl = start(sessions, s, cli_env(tmp_path), "--id", "o", markdown=False)
    for n in range(4):
        repl.child.sendline(f"question {n}")
        repl.prompt()
    out = repl.command("/compact", r"summary stored at seq (\d+)[^\r]*\r\n")
    assert "it stands in for seqs up to 3" in out
    doc = replay_json(s, "o")
    summary = doc["messages"][-1]
    assert summary["role"] == "system"
    assert summary["params"]["summary"]["covers_to_seq"] == 3
    assert summary["content"].startswith("Echo: Summarise the conversation")
    assert [m["content"] for m in doc["messages"][:2]] == ["question 0",
                                                           doc["messages"][1]["content"]]
    assert len(doc["messages"]) == 9  # nothing removed

    out = repl.command("/fork", r"now in (c-[\w-]+) \(o is unchanged\)\r\n")
    fork_id = re.search(r"now in (c-[\w-]+)", out).group(1)  # type: ignore[union-attr]
    repl.child.sendline("in the fork")
    repl.prompt()
    assert len(replay_json(s, "o")["messages"]) == 9
    forked = replay_json(s, fork_id)
    assert forked["metadata"]["forked_from"] == {"id": "o", "seq": 8,
                                                 "hash": summary["hash"]}
    assert [m["hash"] for m in forked["messages"][:9]] == [m["hash"] for m in doc["messages"]]
    assert forked["messages"][9]["content"] == "in the fork"

    out = repl.command("/edit in the fork, edited", r"now in (c-[\w-]+) \(")
    edit_id = re.search(r"now in (c-[\w-]+)", out).group(1)  # type: ignore[union-attr]
    edited = replay_json(s, edit_id)
    assert edited["metadata"]["forked_from"]["id"] == fork_id
    assert len(edited["messages"]) == 11
    assert edited["messages"][9]["content"] == "in the fork, edited"
    assert edited["messages"][10]["content"].startswith("Echo: in the fork, edited")
    assert len(replay_json(s, fork_id)["messages"]) == 11  # the fork it came from is intact
    assert repl.eof() == 0


def test_a_template_in_the_repl(local_store_url: str, tmp_path: Path,
                                sessions: list[ReplSession]) -> None:
    env = cli_env(tmp_path)
    saved = invoke(["templates", "save", "pirate", "--system", "You are a {kind} pirate.",
                    "--param", "temperature=0.5"], env=env)
    assert saved.code == 0, saved.err
    repl = start(sessions, local_store_url, env, "--id", "t", "--template", "pirate",
                 "-p", "kind", "polite", markdown=False)
    repl.child.sendline("ahoy")
    repl.prompt()
    system, user = replay_json(local_store_url, "t")["messages"][:2]
    assert system["content"] == "You are a polite pirate."
    assert user["params"] == {"temperature": 0.5}


def test_replay_renders_markdown_on_a_terminal_and_raw_turns_it_off(
        local_store_url: str, tmp_path: Path) -> None:
    import pexpect

    env = cli_env(tmp_path)
    assert invoke(["ask", "--model", "fake", "--id", "p", "**strong** words"],
                  store=local_store_url).code == 0
    for args, styled in (([], True), (["--raw"], False)):
        child = pexpect.spawn(CHATSTATE, ["--store", local_store_url, "replay", "p", *args],
                              env=env, encoding="utf-8", timeout=20, dimensions=(50, 200))
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        out = child.before
        assert ("\x1b[1mstrong\x1b[0m" in out) is styled
        assert ("**strong** words" in out) is not styled


def test_the_repl_says_once_that_older_messages_are_left_out(
        local_store_url: str, tmp_path: Path, sessions: list[ReplSession]) -> None:
    repl = start(sessions, local_store_url, cli_env(tmp_path), "--id", "n",
                 "--context-window", "80", markdown=False)
    seen = ""
    for n in range(6):
        repl.child.sendline(f"question {n}")
        seen += repl.prompt()
    notes = re.findall(r"sending the last (\d+) of (\d+) messages \(context window 80\)", seen)
    assert len(notes) == 1, seen
    sent, total = map(int, notes[0])
    assert sent < total
    assert sent % 2 == 1  # whole turns, ending with the new question
    assert len(replay_json(local_store_url, "n")["messages"]) == 12  # the store keeps all


def test_a_malformed_mouse_report_is_dropped_not_a_traceback(
        local_store_url: str, tmp_path: Path, sessions: list[ReplSession]) -> None:
    """ESC [ M and three characters is a mouse report to prompt_toolkit; one that is not a
    known event (here a C1 character) used to print "Exception 155 / Press ENTER to
    continue" over the prompt. It is dropped, and the line typed after it is sent."""
    repl = start(sessions, local_store_url, cli_env(tmp_path), "--id", "mouse")
    repl.child.send("\x1b[M\u009b!!")
    repl.child.send("after\r")
    seen = repl.prompt()
    assert "Exception" not in seen, seen
    assert "Press ENTER" not in seen, seen
    assert "Echo: after" in strip_ansi(seen)
    assert replay_json(local_store_url, "mouse")["messages"][0]["content"] == "after"


def test_rm_declined_on_a_terminal_keeps_the_conversation_and_exits_1_not_130(
        local_store_url: str, tmp_path: Path) -> None:
    import pexpect

    assert invoke(["ask", "--model", "fake", "--id", "keep", "hi"],
                  store=local_store_url).code == 0
    child = pexpect.spawn(CHATSTATE, ["--store", local_store_url, "rm", "keep"],
                          env=cli_env(tmp_path), encoding="utf-8", timeout=20)
    child.expect(r"delete keep \(2 messages\)\? \[y/N\]")
    child.sendline("n")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1  # declining is not an interrupt (130)
    assert "not deleted: keep is kept as it was" in child.before
    assert [r["id"] for r in invoke(["list", "--json"], store=local_store_url).json()] == \
        ["keep"]
