"""Driving the real ``chatstate`` command from tests: in-process, as a subprocess, on a pty.

``invoke`` runs ``chatstate.cli.common.run`` (the same code path as the console
script, exit codes and error paragraphs included) inside click's stream
isolation, so stdout and stderr stay apart; it is fast enough to use for most
tests. ``run_cli`` starts the installed ``chatstate`` script, for the things that
only a real process shows (file descriptors, signals, the import-time cost).
``cli_env`` is the environment both use: HOME and the XDG directories under
``tmp_path`` (REPL history lands there), no model credentials from the caller,
and no ``CHATSTATE_STORE`` leaking in.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pexpect
from click.testing import CliRunner

from chatstate.cli import cli
from chatstate.cli.common import run

CHATSTATE = str(Path(sys.executable).with_name("chatstate"))
API_KEY = "sk-test-cli-0123456789abcdef"  # long enough that redaction never hits real words
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[=>()][0-9A-Za-z]?")
HOSTILE = "A\x1b]0;pwned\x07B\x1b[2JC\rD\x00E\x9bF\x1b[31mred\u202eG"
"""OSC retitle, clear screen, carriage return, NUL, C1 CSI, an SGR colour and a bidi override."""
HOSTILE_SHOWN = "A^[]0;pwned\\x07B^[[2JC\\x0dD\\x00E\\x9bF^[[31mred\\u202eG"
"""HOSTILE as a terminal shows it: every control character spelled out."""
RAW_CONTROLS = ("\x1b]0;pwned", "\x1b[2J", "\x07", "\x00", "\x9b", "C\rD", "\x1b[31m",
                "\u202e")
"""Pieces of HOSTILE that must never reach a terminal raw."""
CLEARED = ("CHATSTATE_STORE", "CHATSTATE_ALLOW_EPHEMERAL", "CHATSTATE_API_KEY",
           "CHATSTATE_BASE_URL", "CHATSTATE_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL",
           "CHATSTATE_FAKE_REPLY_WORDS", "CHATSTATE_FAKE_CHUNK_DELAY", "DEPLOY_ID",
           "CHATSTATE_CONFIG_DIR", "CHATSTATE_CONTEXT_WINDOW", "CHATSTATE_API")


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    @property
    def first_err_line(self) -> str:
        return self.err.splitlines()[0] if self.err else ""


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A clean environment for a chatstate process whose home is under ``tmp_path``."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(HOME=str(home), XDG_STATE_HOME=str(home / "state"),
               XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"),
               PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm", COLUMNS="200", LINES="50",
               PYTHONUNBUFFERED="1",
               # the pace the REPL and interrupt tests were written for: slow enough to
               # press Ctrl-C mid-reply
               CHATSTATE_FAKE_CHUNK_DELAY="0.01")
    env.update(extra)
    return env


def invoke(args: list[str], *, store: str | None = None, input: str | bytes | None = None,
           env: dict[str, str] | None = None) -> Result:
    """``chatstate [--store STORE] ARGS`` in this process, through ``common.run``."""
    argv = (["--store", store] if store else []) + args
    overrides: dict[str, str | None] = dict.fromkeys(CLEARED)
    overrides.update(env or {})
    runner = CliRunner()
    with runner.isolation(input=input, env=overrides) as (out, err, _):
        code = run(cli, argv)
        sys.stdout.flush()
        sys.stderr.flush()
        return Result(code, out.getvalue().decode(), err.getvalue().decode())


def run_cli(args: list[str], env: dict[str, str], *, store: str | None = None,
            input: str | bytes | None = None, timeout: float = 60) -> Result:
    """The installed ``chatstate`` script as a subprocess."""
    argv = [CHATSTATE] + (["--store", store] if store else []) + args
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run(argv, input=data, capture_output=True, env=env, timeout=timeout,
                          check=False)
    return Result(proc.returncode, proc.stdout.decode(errors="surrogateescape"),
                  proc.stderr.decode(errors="surrogateescape"))


def replay_json(store: str, cid: str) -> dict[str, Any]:
    """The conversation as ``replay --format json`` prints it."""
    result = invoke(["replay", cid, "--format", "json"], store=store)
    assert result.code == 0, result.err
    doc: dict[str, Any] = result.json()
    return doc


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


# prompt_toolkit turns bracketed paste on (ESC [?2004h) each time it starts reading a line,
# and only then; its redraws of a prompt being edited do not, so this marks a fresh prompt.
FRESH_PROMPT = re.compile(r"\x1b\[\?2004h[^\n]*?you>")


class ReplSession:
    """``chatstate --store STORE chat --model MODEL ARGS`` on a pseudo-terminal.

    ``--raw`` unless ``markdown``: most tests read the streamed text as it arrives.
    ``model`` is the built-in fake unless given (with ``--base-url`` in ``args``).
    """

    def __init__(self, store: str, env: dict[str, str], *args: str,
                 timeout: float = 30, markdown: bool = False, model: str = "fake") -> None:
        self.log = io.StringIO()
        raw = [] if markdown else ["--raw"]
        self.child = pexpect.spawn(CHATSTATE, ["--store", store, "chat", "--model", model,
                                               *raw, *args], env=env, encoding="utf-8",
                                   timeout=timeout, dimensions=(50, 200))
        self.child.logfile_read = self.log

    def prompt(self) -> str:
        """Wait for a fresh prompt; return what was printed before it (ANSI stripped)."""
        self.child.expect(FRESH_PROMPT)
        return strip_ansi(self.child.before)

    def command(self, line: str, answer: str) -> str:
        """Send a line at a fresh prompt, wait for ``answer`` (a regex), then the next prompt."""
        self.child.sendline(line)
        self.child.expect(answer)
        seen = strip_ansi(self.child.before + self.child.after)
        return seen + self.prompt()

    def eof(self) -> int:
        """Ctrl-D; the exit status."""
        self.child.sendcontrol("d")
        self.child.expect(pexpect.EOF)
        self.child.close()
        status: int = self.child.exitstatus
        return status

    @property
    def raw(self) -> str:
        return self.log.getvalue()

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
