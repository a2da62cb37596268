"""`--mcp-config PATH`, `CHATSTATE_MCP_CONFIG`, `--mcp 'COMMAND ARGS'` and `--yes`.

The servers start when the first message offers their tools, once per process,
and stop when the command ends (also on Ctrl-C). A server that fails prints one
line on stderr and offers no tools; the other tools still work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

__all__ = ["ToolBox", "allow_listed_mcp_options", "mcp_options", "open_mcp"]


def mcp_options(f: Callable[..., Any], *, yes: bool = True) -> Callable[..., Any]:
    if yes:
        f = click.option("--yes", "-y", "yes", is_flag=True,
                         help="Run MCP tools that change things without asking (read-only "
                              "and allow-listed tools always run).")(f)
    f = click.option("--mcp", "mcp_commands", metavar="'COMMAND ARGS'", multiple=True,
                     help="An MCP server over stdio whose tools the model may call "
                          "(repeatable), e.g. --mcp 'uvx mcp-server-time'.")(f)
    return click.option(
        "--mcp-config", "mcp_config", metavar="PATH", envvar="CHATSTATE_MCP_CONFIG",
        type=click.Path(dir_okay=False, path_type=Path),
        help="A JSON file of MCP servers in the mcpServers shape Claude Desktop and Cursor "
             "use [env CHATSTATE_MCP_CONFIG].")(f)


def allow_listed_mcp_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """For batch: no --yes, so only read-only and allow-listed MCP tools run."""
    return mcp_options(f, yes=False)


class ToolBox:
    """The tools of a command: --functions ones and the MCP servers', iterated per send."""

    def __init__(self, functions: list[Any], mcp: Any) -> None:
        self.functions, self.mcp = functions, mcp

    def __iter__(self) -> Iterator[Any]:
        yield from self.functions
        if self.mcp is not None:
            yield from self.mcp

    def __bool__(self) -> bool:
        return bool(self.functions) or self.mcp is not None

    def close(self) -> None:
        if self.mcp is not None:
            self.mcp.close()


def open_mcp(config: Path | None, commands: tuple[str, ...], approve: Any,
             say: Callable[[str], None]) -> Any:
    """The McpTools of the options, or None when none was given. Nothing starts yet."""
    if config is None and not commands:
        return None
    from chatstate.errors import ChatstateError
    from chatstate.tools_mcp import command_server, load_config, mcp_tools
    from chatstate.tools_mcp.config import distinct_names

    try:
        servers = load_config(config) if config is not None else []
        servers += [command_server(c) for c in commands]
        return mcp_tools(distinct_names(servers), approve=approve, on_event=say)
    except ChatstateError as exc:
        raise click.UsageError(str(exc)) from exc
