"""The REPL's line input: prompt_toolkit on a terminal, plain stdin otherwise.

On a terminal: line editing, Esc-Enter for a newline, and a history file that
is private (0600 in a 0700 directory) before anything is typed into it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def make_reader() -> Callable[[], str]:
    """prompt_toolkit on a terminal (line editing, persistent history); plain stdin otherwise."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        def plain() -> str:
            line = sys.stdin.readline()
            if not line:
                raise EOFError
            return line.rstrip("\n")
        return plain
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.keys import Keys

    path = private_history_file()
    keys = KeyBindings()

    @keys.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    keys.add(Keys.Vt100MouseEvent)(_tolerant_mouse())

    session: PromptSession[str] = PromptSession(history=FileHistory(str(path)),
                                                key_bindings=keys, multiline=False,
                                                enable_open_in_editor=True)

    def read(*, editor: bool = False) -> str:
        # editor: open $EDITOR at once, as Ctrl-X Ctrl-E does (prompt_toolkit's own
        # open_in_editor), and take what is saved as the line
        def open_editor() -> None:
            session.default_buffer.open_in_editor(validate_and_handle=True)

        return session.prompt("you> ", pre_run=open_editor if editor else None)

    read.editor = True  # type: ignore[attr-defined]
    return read


def read_in_editor(read: Callable[..., str]) -> str | None:
    """The next message, written in $EDITOR through ``read`` (a terminal reader from
    ``make_reader``); None when input is not a terminal (no editor can be opened)."""
    if not getattr(read, "editor", False):
        return None
    try:
        return read(editor=True)
    except (EOFError, KeyboardInterrupt):
        return ""


def _tolerant_mouse() -> Callable[[Any], Any]:
    """prompt_toolkit's mouse handler, minus its traceback on a malformed report.

    Its parser takes ESC [ M and the next three characters as a mouse report; a
    pasted or mistyped sequence whose bytes are not a known event (a C1 byte,
    say) raised KeyError and printed "Exception 155 / Press ENTER to continue"
    over the prompt. Such a report is not a click: it is dropped."""
    from prompt_toolkit.key_binding.bindings.mouse import load_mouse_bindings
    from prompt_toolkit.keys import Keys

    (binding,) = load_mouse_bindings().get_bindings_for_keys((Keys.Vt100MouseEvent,))
    handler = binding.handler

    def tolerant(event: Any) -> Any:
        try:
            return handler(event)
        except (KeyError, ValueError, IndexError):
            return None

    return tolerant


def private_history_file() -> Any:
    """The REPL's history file, created 0600 in a 0700 directory before prompt_toolkit
    appends to it (it would create it with the umask's mode: typed text is private)."""
    import os

    from chatstate.ops.doctor import history_path

    path = history_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file may have been made readable by others
    finally:
        os.close(fd)
    return path


@contextmanager
def keys_held() -> Iterator[None]:
    """While a reply streams: the terminal does not echo what is typed (an echoed key moves
    the cursor under rich's live region, which then redraws a line twice, and a typed line
    would land in the reply). The line discipline stays canonical, so what is typed is held
    by the terminal and read by the next prompt as its input; Ctrl-C still interrupts."""
    import termios

    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    if fd is None:
        yield
        return
    saved = termios.tcgetattr(fd)
    quiet = termios.tcgetattr(fd)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)  # TCSANOW: typed-ahead input stays
