"""MCP tools as chatstate tools: ``mcp_tools(config)`` for ``chat.send(..., tools=...)``.

    with chatstate.mcp_tools("~/.config/Claude/claude_desktop_config.json") as tools:
        chat.send("What time is it in Tokyo?", tools=tools)

``McpTools`` is iterable: the first iteration starts its servers (once per
process for that object) and lists their tools; a server that fails to start is
reported on ``on_event`` and offers no tools. Each tool is a ``Tool`` whose
``idempotent`` comes from the server's annotations (``readOnlyHint`` or
``idempotentHint`` true: may run again after a crash; otherwise, or without
annotations: never twice), unless the config's ``"idempotent"`` says otherwise.

Approval: ``approve`` decides for a tool that is not read-only and not on the
config's allow-list: ``"yes"`` (run everything: the library's default, and
``ask --yes``), ``"allow-list"`` (refuse it: ``ask`` without ``--yes``, batch),
or a callable ``(tool, arguments) -> "y" | "n" | "always"`` (the REPL's prompt;
"always" holds for that tool until ``forget_always()``). The decision is stored
with the call's result.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from chatstate.core.tools import Approval, Tool, current_call_id
from chatstate.tools_mcp.config import ServerConfig, load_config, parse_config
from chatstate.tools_mcp.results import to_output
from chatstate.tools_mcp.server import McpServer

__all__ = ["McpTool", "McpTools", "mcp_tools"]

Asker = Callable[["McpTool", dict[str, Any]], str]
Policy = Literal["yes", "allow-list"] | Asker


class McpTool(Tool):
    """One tool of an MCP server; calling it calls the server."""

    def __init__(self, owner: McpTools, server: McpServer, spec: dict[str, Any],
                 name: str) -> None:
        self.server, self.remote_name, self.owner = server, str(spec["name"]), owner
        self.name = name
        self.description = str(spec.get("description") or "")
        schema = spec.get("inputSchema")
        self.parameters = dict(schema) if isinstance(schema, dict) else {"type": "object"}
        self.parameters.setdefault("properties", {})
        notes = spec.get("annotations") or {}
        self.read_only = notes.get("readOnlyHint") is True
        rule = server.config.tools.get(self.remote_name)
        override = rule.idempotent if rule is not None else None
        self.idempotent = override if override is not None else \
            self.read_only or notes.get("idempotentHint") is True
        self.fn = self._run

    def __repr__(self) -> str:
        return (f"McpTool({self.name!r}, server={self.server.config.name!r}, "
                f"idempotent={self.idempotent}, read_only={self.read_only})")

    def parse_args(self, args: dict[str, Any]) -> dict[str, Any]:
        return args  # the server validates against its own schema, and says what is wrong

    def approval(self, call: dict[str, Any]) -> Approval | None:
        return self.owner.decide(self, call)

    def _run(self, /, **arguments: Any) -> Any:  # an argument may be named "self"
        return to_output(self.server.call(self.remote_name, arguments, current_call_id()))


class McpTools:
    """The tools of some MCP servers, started on first use; ``close()`` stops them."""

    def __init__(self, servers: Sequence[ServerConfig], *, approve: Policy = "yes",
                 on_event: Callable[[str], None] | None = None) -> None:
        self.servers = [McpServer(c) for c in servers]
        self.approve: Policy = approve
        self.on_event = on_event
        self.failed: dict[str, str] = {}  # server name -> why it offers no tools
        self._tools: list[McpTool] | None = None
        self._always: set[str] = set()
        self._lock = threading.Lock()  # batch sends from several threads at once

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools())

    def __enter__(self) -> McpTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tools(self) -> list[McpTool]:
        """Every server's tools (starting the servers the first time)."""
        with self._lock:
            return self._started()

    def _started(self) -> list[McpTool]:
        if self._tools is None:
            from concurrent.futures import ThreadPoolExecutor

            # started side by side: a slow server does not delay the others
            with ThreadPoolExecutor(max(len(self.servers), 1)) as pool:
                started = list(pool.map(_start, self.servers))
            found: list[tuple[McpServer, dict[str, Any]]] = []
            for server, (specs, error) in zip(self.servers, started, strict=True):
                if error is not None:  # one line; the other servers' tools still work
                    self.failed[server.config.name] = error
                    self._say(f"mcp: {error}")
                found += [(server, spec) for spec in specs]
            self._tools = _named(self, found)
        return self._tools

    def decide(self, tool: McpTool, call: dict[str, Any]) -> Approval:
        """Whether ``call`` of ``tool`` may run, and why (stored with its result)."""
        if tool.read_only:
            return Approval(True, "read-only")
        if tool.server.config.allowed(tool.remote_name):
            return Approval(True, "allow-list")
        if tool.name in self._always:
            return Approval(True, "always (this conversation)")
        if self.approve == "yes":
            return Approval(True, "yes")
        if self.approve == "allow-list":
            return Approval(False, f"{tool.name} is not on the allow-list of MCP server "
                            f"{tool.server.config.name!r}; the user did not allow it")
        try:
            args = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            args = {}
        answer = self.approve(tool, args if isinstance(args, dict) else {})
        if answer == "always":
            self._always.add(tool.name)
            return Approval(True, "always (this conversation)")
        if answer == "y":
            return Approval(True, "user: yes")
        return Approval(False, "the user declined to run it")

    def forget_always(self) -> None:
        """A new conversation: "always" answers no longer hold."""
        self._always.clear()

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        self._tools = None

    def _say(self, line: str) -> None:
        if self.on_event is not None:
            self.on_event(line)
        else:
            import logging

            logging.getLogger("chatstate.tools").warning("%s", line)


def mcp_tools(config: str | Any, *, approve: Policy = "yes",
              on_event: Callable[[str], None] | None = None) -> McpTools:
    """MCP tools from a config: a path to an ``mcpServers`` JSON file, the parsed object,
    or a list of ``ServerConfig``. Nothing starts until the tools are first used."""
    import importlib.util

    if importlib.util.find_spec("mcp") is None:
        from chatstate.errors import MissingExtra

        raise MissingExtra("MCP tools need the mcp SDK: pip install 'chatstate[mcp]'",
                           extra="mcp")
    if isinstance(config, (list, tuple)):
        servers = list(config)
    elif isinstance(config, dict):
        servers = parse_config(config)
    else:
        servers = load_config(config)
    return McpTools(servers, approve=approve, on_event=on_event)


def _start(server: McpServer) -> tuple[list[dict[str, Any]], str | None]:
    try:
        return server.start(), None
    except Exception as exc:
        return [], str(exc)


def _named(owner: McpTools, found: list[tuple[McpServer, dict[str, Any]]]) -> list[McpTool]:
    """Tool names valid for the API; a name two servers share is prefixed by its server."""
    def clean(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:64] or "tool"

    counts: dict[str, int] = {}
    for _, spec in found:
        counts[clean(str(spec["name"]))] = counts.get(clean(str(spec["name"])), 0) + 1
    out = []
    for server, spec in found:
        name = clean(str(spec["name"]))
        if counts[name] > 1:
            name = clean(f"{server.config.name}_{spec['name']}")
        out.append(McpTool(owner, server, spec, name))
    return out
