"""The tool drill's own MCP server (stdio): one non-idempotent tool, ``record``.

    python -m chatstate.drill.mcprecord NOTES

``record(note)`` appends the note to NOTES and fsyncs. It has no annotations,
so chatstate treats it as non-idempotent: never run twice after a crash.
``chatstate drill --tools --mcp`` runs it behind ``chatstate.drill.mcptee``,
which counts the calls it receives.
"""

from __future__ import annotations

import os
import sys


def main(notes: str) -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("chatstate-drill")

    @server.tool()
    def record(note: str) -> str:
        """Write a note down (a side effect: must never run twice)."""
        fd = os.open(notes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{note}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return "recorded"

    server.run()


if __name__ == "__main__":
    main(sys.argv[1])
