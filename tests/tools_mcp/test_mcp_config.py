"""The mcpServers config: the shape other clients write, chatstate's own keys, and
errors that name the file, the server and the key (no server is started here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatstate.errors import InvalidInput
from chatstate.tools_mcp import command_server, load_config
from chatstate.tools_mcp.config import parse_config


def test_the_claude_desktop_shape_and_chatstates_own_keys(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"globalShortcut": "x", "mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "web": {"type": "http", "url": "http://127.0.0.1:1/mcp", "headers": {"A": "b"},
                "timeout": 5, "allow": ["t1"], "tools": {"t2": {"allow": True,
                                                                "idempotent": False}}},
        "off": {"command": "x", "disabled": True}}}))
    time, web = load_config(path)
    assert (time.name, time.transport, time.args, time.env) == (
        "time", "stdio", ("mcp-server-time",), {"TZ": "UTC"})
    assert (web.transport, web.timeout, web.headers) == ("http", 5.0, {"A": "b"})
    assert web.allowed("t1") and web.allowed("t2") and not web.allowed("t3")
    assert web.tools["t2"].idempotent is False
    assert "A" not in web.describe() and "b" not in web.describe()  # no header values


@pytest.mark.parametrize("entry,says", [
    ({"command": "x", "url": "http://h/mcp"}, "either \"command\""),
    ({}, "either \"command\""),
    ({"url": "http://h/sse", "type": "sse"}, "SSE transport is not supported"),
    ({"command": "x", "args": "a b"}, "mcpServers.s.args must be a list of strings"),
    ({"command": "x", "timeout": 0}, "mcpServers.s.timeout must be a positive number"),
    ({"command": "x", "tools": {"t": {"idempotent": "no"}}},
     "mcpServers.s.tools.t.idempotent must be true or false"),
])
def test_errors_name_the_server_and_key(entry: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidInput, match=r"cfg\.json: mcpServers\.s") as err:
        parse_config({"mcpServers": {"s": entry}}, "cfg.json")
    assert says in str(err.value)


def test_a_file_that_is_not_there_or_not_json(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read it"):
        load_config(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InvalidInput, match=r"bad\.json: not valid JSON"):
        load_config(tmp_path / "bad.json")


@pytest.mark.parametrize("line,name", [
    ("npx -y @modelcontextprotocol/server-memory@2026.8.31", "server-memory"),
    ("uvx mcp-server-time --local-timezone UTC", "mcp-server-time"),
    ("/usr/local/bin/mcp-server-git --repository /src", "mcp-server-git"),
])
def test_mcp_command_line_is_one_stdio_server(line: str, name: str) -> None:
    server = command_server(line)
    assert server.name == name and server.transport == "stdio"
    assert [server.command, *server.args] == line.split()
