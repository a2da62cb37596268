"""A small MCP server (the SDK's MCPServer) with tools that misbehave on purpose.

    python tests/support/mcp_test_server.py EFFECTS            # stdio
    python tests/support/mcp_test_server.py EFFECTS --http PORT  # Streamable HTTP

``write_note`` appends to EFFECTS (no annotations: non-idempotent), ``crash``
exits the process mid-call, ``hang`` never answers, ``fail`` raises (an
``isError`` result), ``picture`` returns text, an image of 100 KiB and an
embedded resource, ``receiver`` echoes an argument named ``self``, ``header`` echoes
an HTTP request header.
"""

from __future__ import annotations

import base64
import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import EmbeddedResource, ImageContent, TextContent, TextResourceContents

EFFECTS = sys.argv[1]
server = MCPServer("chatstate-test")


@server.tool()
def write_note(note: str) -> str:
    """Write a note down (a side effect)."""
    fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{note}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"noted {note}"


@server.tool()
def crash() -> str:
    """Exit the server mid-call."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer."""
    while True:
        await anyio.sleep(1)


@server.tool()
def fail(why: str) -> str:
    """Raise an error."""
    raise ValueError(f"failed on purpose: {why}")


@server.tool()
def picture() -> list[TextContent | ImageContent | EmbeddedResource]:
    """Text, a 100 KiB image and an embedded resource."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 400
    return [TextContent(type="text", text="a picture"),
            ImageContent(type="image", data=base64.b64encode(png).decode(),
                         mime_type="image/png"),
            EmbeddedResource(type="resource", resource=TextResourceContents(
                uri="file:///notes/readme.txt", mime_type="text/plain", text="hello"))]


@server.tool()
def receiver(self: str) -> str:
    """Echo an argument named as Python names a method's receiver."""
    return f"self is {self}"


@server.tool()
def header(name: str, ctx: Context) -> str:
    """An HTTP request header, as the server received it."""
    request = getattr(ctx.request_context, "request", None)
    return str(request.headers.get(name)) if request is not None else "(no request)"


if __name__ == "__main__":
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run()
