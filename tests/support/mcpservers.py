"""Real MCP servers for the tests: mcp-server-time (PyPI, a cached venv), the npm
reference servers (a cached npm prefix), and the suite's misbehaving server
(``mcp_test_server.py``) over stdio or Streamable HTTP on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.npmpkgs import cached_npm, npm_bin
from support.venvs import cached_venv

NPM = ["@modelcontextprotocol/server-memory@2026.8.31",
       "@modelcontextprotocol/server-everything@2026.8.31",
       "@modelcontextprotocol/server-filesystem@2026.8.31"]
TEST_SERVER = Path(__file__).with_name("mcp_test_server.py")


def time_server() -> dict[str, Any]:
    bin_dir = cached_venv("mcp-server-time", ["mcp-server-time==2026.10.19"], tier="mcp")
    return {"command": str(bin_dir / "mcp-server-time"), "args": ["--local-timezone", "UTC"]}


def git_server(repository: Path) -> dict[str, Any]:
    bin_dir = cached_venv("mcp-server-git", ["mcp-server-git==2026.10.19"], tier="mcp")
    return {"command": str(bin_dir / "mcp-server-git"), "args": ["--repository",
                                                                 str(repository)]}


def npm_server(package: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    command = npm_bin(cached_npm(NPM, tier="mcp"), f"@modelcontextprotocol/{package}")
    return {"command": command[0], "args": [*command[1:], *args], "env": env or {}}


def suite_server(effects: Path, **more: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(TEST_SERVER), str(effects)], **more}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def http_test_server(effects: Path) -> Iterator[str]:
    """The test server over Streamable HTTP; yields its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(TEST_SERVER), str(effects), "--http",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the MCP test server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()
