"""Count the tool calls an MCP server receives: a stdio pass-through for the drill.

    python -m chatstate.drill.mcptee LOG -- COMMAND [ARGS...]

Runs COMMAND as the MCP server and copies stdin to it line by line; before it
forwards a ``tools/call`` request it appends the request's chatstate call id
(``_meta["chatstate/tool_call_id"]``) and tool name to LOG and fsyncs, so the
drill can count how often each call reached the server, whatever instant the
client is killed at. The server's stdout and stderr are its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence

META_CALL_ID = "chatstate/tool_call_id"  # as chatstate.tools_mcp.server sends it


def log_call(log: str, line: bytes) -> None:
    try:
        request = json.loads(line)
    except ValueError:
        return
    if not isinstance(request, dict) or request.get("method") != "tools/call":
        return
    params = request.get("params") or {}
    call_id = (params.get("_meta") or {}).get(META_CALL_ID, "-")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{call_id} {params.get('name')}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def main(argv: Sequence[str]) -> int:
    log, sep, *command = argv
    if sep != "--" or not command:
        sys.stderr.write("usage: python -m chatstate.drill.mcptee LOG -- COMMAND [ARGS...]\n")
        return 2
    server = subprocess.Popen(command, stdin=subprocess.PIPE)
    assert server.stdin is not None
    try:
        for line in sys.stdin.buffer:
            log_call(log, line)
            server.stdin.write(line)
            server.stdin.flush()
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        with contextlib.suppress(BrokenPipeError):
            server.stdin.close()
    try:
        return server.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
