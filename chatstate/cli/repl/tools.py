"""The REPL's tools: `/tools` (list servers and tools, `off`, `on`) and the approval prompt.

An MCP tool that is neither read-only nor allow-listed asks before it runs:
``y`` runs it this once, ``n`` answers the call "not run", ``always`` runs it
from then on in this conversation. The answer is stored with the call's result.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from chatstate.cli.render import neutralise


class ToolCommands:
    """Mixed into the REPL, which provides ``chat`` and ``say``."""

    chat: Any
    toolbox: Any
    tools_on: bool

    def say(self, text: str) -> None: ...  # pragma: no cover - provided by the REPL

    @property
    def tools(self) -> Any:
        """What the next send offers the model: None once `/tools off`."""
        return self.toolbox if self.toolbox and self.tools_on else None

    def do_tools(self, arg: str) -> None:
        if arg in ("off", "on"):
            self.tools_on = arg == "on"
            self.say(f"tools {arg}: the next messages {'offer' if self.tools_on else 'offer no'}"
                     " tools to the model")
            return
        if arg:
            self.say("usage: /tools, /tools off, /tools on")
            return
        box = self.toolbox
        if not box:
            self.say("no tools: start chat with --functions FILE.py, --mcp-config PATH or "
                     "--mcp 'COMMAND ARGS'")
            return
        state = "" if self.tools_on else " (off: /tools on offers them again)"
        for t in box.functions:
            self.say(f"function {t.name}{'' if t.idempotent else ' (not idempotent)'}{state}")
        if box.mcp is not None:
            self._list_mcp(box.mcp, state)

    def _list_mcp(self, mcp: Any, state: str) -> None:
        tools = mcp.tools()  # starts the servers not started yet
        for server in mcp.servers:
            cfg = server.config
            why = mcp.failed.get(cfg.name)
            status = f"failed: {why}" if why else "running" if server.running else "stopped"
            self.say(f"mcp server {cfg.name} ({cfg.transport}: {cfg.describe()}): "
                     f"{neutralise(status)}{state}")
            for t in tools:
                if t.server is server:
                    flags = ["read-only" if t.read_only else
                             "allowed" if cfg.allowed(t.remote_name) else "asks first",
                             "idempotent" if t.idempotent else "never run twice"]
                    first = t.description.splitlines()[0] if t.description else ""
                    self.say(f"  {t.name} ({', '.join(flags)}): {neutralise(first)}")

    def approve_prompt(self, tool: Any, arguments: dict[str, Any]) -> str:
        """The approval question for one call: "y", "n" or "always"."""
        import json

        shown = neutralise(json.dumps(arguments, ensure_ascii=False))
        shown = shown if len(shown) <= 300 else shown[:300] + "…"
        click.echo(f"run MCP tool {tool.name} of {tool.server.config.name}({shown})? "
                   "[y]es / [n]o / [a]lways in this conversation: ", nl=False, err=True)
        answer = _read_answer().strip().lower()
        if answer in ("a", "always"):
            return "always"
        return "y" if answer in ("y", "yes") else "n"


def _read_answer() -> str:
    """One line from the user, echoed even while a reply's keys are held."""
    if not sys.stdin.isatty():
        line = sys.stdin.readline()
        click.echo(line.strip(), err=True)  # piped: show the answer it read
        return line
    import termios

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    shown = termios.tcgetattr(fd)
    shown[3] |= termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, shown)
    try:
        return sys.stdin.readline()
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)
