"""Tools from MCP servers for the tool loop (the ``chatstate[mcp]`` extra).

A tool source, between the core (whose ``Tool`` it implements) and the session
(whose loop runs it); nothing below imports it, and the ``mcp`` SDK is imported
only when a server starts. See docs/mcp.md.
"""

from __future__ import annotations

from chatstate.tools_mcp.config import ServerConfig, ToolRule, command_server, load_config
from chatstate.tools_mcp.server import McpServer, McpServerError
from chatstate.tools_mcp.tools import McpTool, McpTools, mcp_tools

__all__ = ["McpServer", "McpServerError", "McpTool", "McpTools", "ServerConfig", "ToolRule",
           "command_server", "load_config", "mcp_tools"]
