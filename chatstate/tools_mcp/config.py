"""MCP server configuration in the ``mcpServers`` shape Claude Desktop and Cursor use.

    {"mcpServers": {
        "time":   {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "remote": {"url": "http://127.0.0.1:8000/mcp", "headers": {"X-Team": "a"}},
        "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"],
                   "allow": ["create_entities"],
                   "tools": {"delete_entities": {"idempotent": false, "allow": false}}}}}

chatstate's own keys beside the standard ones: ``timeout`` (seconds a call may
take, default 60), ``startTimeout`` (seconds to start and list tools, default
30), ``allow`` (tools that run without asking), ``tools`` (per tool:
``idempotent`` overrides the server's annotations, ``allow`` adds it to or
takes it off the allow-list), and ``disabled`` (skip the server), which other
clients use too. Unknown keys are ignored, so the file other clients read works
here unchanged. Every error names the file, the server and the key.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatstate.errors import InvalidInput

__all__ = ["ServerConfig", "ToolRule", "command_server", "load_config", "parse_config"]

_LAUNCHERS = ("npx", "uvx", "node", "python", "python3", "uv", "bunx", "pipx")
DEFAULT_TIMEOUT = 60.0
DEFAULT_START_TIMEOUT = 30.0


@dataclass(frozen=True)
class ToolRule:
    """The config's word on one tool: None leaves it to the server / the defaults."""

    idempotent: bool | None = None
    allow: bool | None = None


@dataclass(frozen=True)
class ServerConfig:
    """One server: stdio (``command``) or Streamable HTTP (``url``)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT
    allow: frozenset[str] = frozenset()
    tools: dict[str, ToolRule] = field(default_factory=dict)

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def describe(self) -> str:
        """Where the server is, without secrets (no env values, no headers)."""
        if self.command is not None:
            return " ".join(shlex.quote(a) for a in (self.command, *self.args))
        from chatstate.core.redact import redact_url

        return redact_url(self.url or "")

    def allowed(self, tool: str) -> bool:
        rule = self.tools.get(tool)
        if rule is not None and rule.allow is not None:
            return rule.allow
        return tool in self.allow


def load_config(path: str | os.PathLike[str]) -> list[ServerConfig]:
    """The servers of an ``mcpServers`` JSON file; InvalidInput naming the file and key."""
    where = Path(path).expanduser()
    try:
        raw = json.loads(where.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInput(f"MCP config {where}: cannot read it ({exc.strerror or exc}); "
                           "pass an existing file to --mcp-config / CHATSTATE_MCP_CONFIG"
                           ) from exc
    except ValueError as exc:
        raise InvalidInput(f"MCP config {where}: not valid JSON ({exc}); it should be "
                           '{"mcpServers": {"NAME": {"command": ..., "args": [...]}}}') from exc
    return parse_config(raw, str(where))


def parse_config(raw: Any, where: str = "MCP config") -> list[ServerConfig]:
    """The servers of an already parsed ``{"mcpServers": {...}}`` object."""
    if not isinstance(raw, dict) or not isinstance(raw.get("mcpServers"), dict):
        raise InvalidInput(f"{where}: needs an object with \"mcpServers\": {{NAME: {{...}}}} "
                           "(the shape Claude Desktop and Cursor use)")
    servers = []
    for name, entry in raw["mcpServers"].items():
        if not isinstance(entry, dict):
            raise InvalidInput(f"{where}: mcpServers.{name} must be an object")
        if entry.get("disabled") is True:
            continue
        servers.append(_server(str(name), entry, f"{where}: mcpServers.{name}"))
    return servers


def command_server(line: str, *, name: str | None = None) -> ServerConfig:
    """``--mcp 'COMMAND ARGS'``: one stdio server from a shell-quoted command line."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise InvalidInput(f"--mcp {line!r}: {exc}; quote it as one shell command") from exc
    if not words:
        raise InvalidInput("--mcp needs a command, e.g. --mcp 'uvx mcp-server-time'")
    if name is None:
        # `npx -y @scope/server-memory` is "server-memory"; `mcp-server-time` is itself
        launcher = Path(words[0]).name in _LAUNCHERS
        named = next((w for w in words[1:] if not w.startswith("-")), None) if launcher \
            else words[0]
        base = Path(named or words[0]).name.split("@")[0]  # no npm @version
        name = re.sub(r"[^A-Za-z0-9_-]", "_", base)
    return ServerConfig(name=name or "mcp", command=words[0], args=tuple(words[1:]))


def distinct_names(servers: list[ServerConfig]) -> list[ServerConfig]:
    """``servers`` with a name used twice made unique (``git``, ``git_2``): two ``--mcp``
    of one server (two repositories of mcp-server-git) gave their tools the same names,
    and every turn failed once its message was stored."""
    import dataclasses

    taken = {s.name for s in servers}
    seen: set[str] = set()
    out = []
    for server in servers:
        name, n = server.name, 1
        while name in seen or (name != server.name and name in taken):
            n += 1
            name = f"{server.name}_{n}"
        seen.add(name)
        out.append(server if name == server.name else dataclasses.replace(server, name=name))
    return out


def _server(name: str, entry: dict[str, Any], where: str) -> ServerConfig:
    kind = entry.get("type") or entry.get("transport")
    if kind in ("sse",):
        raise InvalidInput(f"{where}: the SSE transport is not supported; use the server's "
                           "Streamable HTTP endpoint (\"url\") or stdio (\"command\")")
    command, url = entry.get("command"), entry.get("url") or entry.get("serverUrl")
    if (command is None) == (url is None):
        raise InvalidInput(f"{where}: give either \"command\" (stdio) or \"url\" "
                           "(Streamable HTTP), not both or neither")
    if command is not None and not (isinstance(command, str) and command):
        raise InvalidInput(f"{where}.command must be a non-empty string")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://",
                                                                          "https://"))):
        raise InvalidInput(f"{where}.url must be an http(s) URL")
    return ServerConfig(
        name=name, command=command, args=tuple(_strings(entry.get("args", []), f"{where}.args")),
        env=_mapping(entry.get("env", {}), f"{where}.env"), cwd=entry.get("cwd"),
        url=url, headers=_mapping(entry.get("headers", {}), f"{where}.headers"),
        timeout=_seconds(entry.get("timeout", DEFAULT_TIMEOUT), f"{where}.timeout"),
        start_timeout=_seconds(entry.get("startTimeout", DEFAULT_START_TIMEOUT),
                               f"{where}.startTimeout"),
        allow=frozenset(_strings(entry.get("allow", []), f"{where}.allow")),
        tools=_rules(entry.get("tools", {}), f"{where}.tools"))


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{where} must be a list of strings")
    return list(value)


def _mapping(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidInput(f"{where} must be an object of strings")
    return {str(k): v for k, v in value.items()}


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidInput(f"{where} must be a positive number of seconds")
    return float(value)


def _rules(value: Any, where: str) -> dict[str, ToolRule]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be an object: {{TOOL: {{\"idempotent\": true}}}}")
    rules = {}
    for tool, rule in value.items():
        if not isinstance(rule, dict):
            raise InvalidInput(f"{where}.{tool} must be an object")
        for key in ("idempotent", "allow"):
            if key in rule and not isinstance(rule[key], bool):
                raise InvalidInput(f"{where}.{tool}.{key} must be true or false")
        rules[str(tool)] = ToolRule(idempotent=rule.get("idempotent"), allow=rule.get("allow"))
    return rules
