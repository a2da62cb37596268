"""Issue 28 under a real terminal (tmux): what the screen shows while a Markdown reply
streams, with keys pressed during it, and a code block taller than the screen."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli_helpers import CHATSTATE, cli_env, replay_json
from support.screen import screen_of, wait_for

FIRST = "Firstline"


def _chat(tmp_path: Path) -> str:
    return f"{CHATSTATE} --store json://{tmp_path}/s chat --model fake --id k"


@pytest.mark.parametrize("keys", [["C-c"], ["typed", "Space", "ahead", "Enter"]])
def test_keys_pressed_while_a_reply_streams_leave_the_screen_whole(
        tmp_path: Path, keys: list[str]) -> None:
    """The reply's first line is on screen once, whatever is pressed; a line typed ahead is
    not echoed into the reply but becomes the next prompt's input, after the reply."""
    env = cli_env(tmp_path, CHATSTATE_FAKE_CHUNK_DELAY="0.03", CHATSTATE_FAKE_REPLY_WORDS="60")

    def during(tmux: Callable[..., str]) -> None:
        wait_for(tmux, "you>")
        tmux("send-keys", f"{FIRST} alpha", "Enter")
        for _ in range(600):  # until the reply has begun to stream
            if tmux("capture-pane", "-p", "-J").count(FIRST) >= 2:
                break
        tmux("send-keys", *keys)
        wait_for(tmux, "interrupted" if keys == ["C-c"] else "you> typed ahead")
        tmux("send-keys", "/exit", "Enter")  # held too, if a reply is still streaming

    lines = screen_of(_chat(tmp_path), tmp_path, env=env, during=during).splitlines()
    shown = [line for line in lines if FIRST in line and not line.startswith("you>")]
    assert len(shown) == 1, lines
    if keys != ["C-c"]:
        typed = [i for i, line in enumerate(lines) if "typed ahead" in line]
        stats = next(i for i, line in enumerate(lines) if "tokens/s" in line)
        assert lines[typed[0]].startswith("you> typed ahead"), lines
        assert typed[0] > stats, lines  # after the first reply, not inside it
        stored = replay_json(f"json://{tmp_path}/s", "k")["messages"]
        assert [m["content"] for m in stored if m["role"] == "user"] == [
            f"{FIRST} alpha", "typed ahead"]


CODE = [f"code line {i:02}" for i in range(1, 61)]


@pytest.mark.parametrize("where", ["ask", "chat"])
def test_a_code_block_taller_than_the_screen_streams_whole(tmp_path: Path, where: str) -> None:
    """60 lines of code on a 40-row terminal: no blank line inside it on screen."""
    env = cli_env(tmp_path, CHATSTATE_FAKE_REPLY_WORDS="0")
    message = ["Code:", "```", *CODE, "```"]
    if where == "ask":
        (tmp_path / "msg").write_text("\n".join(message))
        command = (f'{CHATSTATE} --store json://{tmp_path}/s ask --model fake '
                   f'"$(cat {tmp_path}/msg)"')
        during = None
    else:
        command = _chat(tmp_path)

        def during(tmux: Callable[..., str]) -> None:
            wait_for(tmux, "you>")
            keys: list[str] = []
            for line in message:
                keys += [line, "Escape", "Enter"]
            tmux("send-keys", *keys[:-2], "Enter")
            wait_for(tmux, "tokens/s")
            tmux("send-keys", "/exit", "Enter")

    lines = screen_of(command, tmp_path, env=env, during=during, history=True).splitlines()
    start = max(i for i, line in enumerate(lines) if "code line 01" in line)  # the reply's
    rows = [i for i, line in enumerate(lines) if "code line" in line and i >= start]
    assert len(rows) == 60, "\n".join(lines)
    assert rows == list(range(start, start + 60)), lines[start:start + 70]


def test_edit_keeps_the_attachments_of_the_message_it_replaces(tmp_path: Path) -> None:
    from support.cli_helpers import invoke

    s = f"json://{tmp_path}/s"
    png = tmp_path / "chart.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    notes = tmp_path / "notes.txt"
    notes.write_text("the notes\n")
    result = invoke(["chat", "--model", "fake", "--id", "e"], store=s,
                    input=f"/attach {png}\n/attach {notes}\nlook\n/edit look closer\n")
    assert result.code == 0, result.err
    assert "keeps its 2 attachments" in result.err
    assert f"Echo: look closer [image/png {png.stat().st_size} bytes]" in result.out
    fork = [m for m in result.err.split() if m.startswith("c-")][-1]
    edited = replay_json(s, fork)["messages"][-2]
    assert edited["content"][0] == {"type": "text", "text": "look closer"}
    assert edited["content"][1]["type"] == "image_url"
    assert edited["content"][2] == {"type": "text",
                                    "text": '<file name="notes.txt">\nthe notes\n</file>'}


def test_ctrl_x_ctrl_e_writes_the_message_in_the_editor(tmp_path: Path) -> None:
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nprintf 'from the editor' > \"$1\"\n")
    editor.chmod(0o755)
    env = cli_env(tmp_path, EDITOR=str(editor), VISUAL=str(editor))

    def during(tmux: Callable[..., str]) -> None:
        wait_for(tmux, "you>")
        tmux("send-keys", "C-x", "C-e")
        wait_for(tmux, "tokens/s")
        tmux("send-keys", "/exit", "Enter")

    screen_of(_chat(tmp_path), tmp_path, env=env, during=during)
    stored = replay_json(f"json://{tmp_path}/s", "k")["messages"]
    assert stored[0]["content"] == "from the editor"


def test_slash_editor_opens_the_editor_and_sends_what_is_saved(tmp_path: Path) -> None:
    """/editor is Ctrl-X Ctrl-E as a command: the saved text is the message, even one that
    starts with a slash; /copy then copies the reply through the terminal (OSC 52)."""
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nprintf '/not a command\\nsecond line' > \"$1\"\n")
    editor.chmod(0o755)
    env = cli_env(tmp_path, EDITOR=str(editor), VISUAL=str(editor), PATH="/usr/bin:/bin",
                  DISPLAY="", WAYLAND_DISPLAY="")

    def during(tmux: Callable[..., str]) -> None:
        wait_for(tmux, "you>")
        tmux("send-keys", "/editor", "Enter")
        wait_for(tmux, "tokens/s")
        tmux("send-keys", "/copy", "Enter")
        wait_for(tmux, "copied the last reply")
        tmux("send-keys", "/exit", "Enter")

    screen = screen_of(f"{CHATSTATE} --store json://{tmp_path}/s chat --model fake --id k "
                       "--no-log", tmp_path, env=env, during=during)
    assert "with OSC 52" in screen, screen
    assert "not stored (--no-log)" in screen
    assert not (tmp_path / "s" / "k.json").exists()
    assert "Echo: /not a command" in screen
