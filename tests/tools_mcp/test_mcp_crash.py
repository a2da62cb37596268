"""SIGKILL a tool-loop writer at every step while its non-idempotent tool is npm's
server-memory ``create_entities`` (no annotations): the server never receives one
call twice (``chatstate.drill.mcptee`` logs each call it forwards, fsync'd), no call
is left without its result (stored or sent), nothing acknowledged is lost, and the
chain verifies after every kill. Then ``drill --tools --mcp`` with the drill's own
server, from the command line."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli_helpers import invoke
from support.mcpservers import npm_server

from chatstate.drill.tooldrill import run_tool_drill


def test_kill_at_every_step_never_calls_the_server_twice(tmp_path: Path) -> None:
    memory = tmp_path / "memory.jsonl"
    server = npm_server("server-memory", env={"MEMORY_FILE_PATH": str(memory)})
    result = run_tool_drill(f"sqlite://{tmp_path}/drill.db", trials=7, seed=3, mcp={
        "server": server, "tool": "create_entities", "arguments": {"entities": [
            {"name": "Oslo", "entityType": "city", "observations": ["visited"]}]}})
    assert result.problems == [] and result.ok, result.to_dict()
    assert (result.duplicates, result.orphans, result.lost) == (0, 0, 0)
    assert {"call-stored", "tool-before", "tool-after", "result-stored"} <= set(result.steps)
    assert result.tool_runs >= 1  # the server did receive calls
    assert [json.loads(line)["name"] for line in memory.read_text().splitlines()] == ["Oslo"]


def test_drill_tools_mcp_from_the_command_line(tmp_path: Path) -> None:
    store = f"sqlite://{tmp_path}/drill.db"
    out = invoke(["drill", "--tools", "--mcp", "--trials", "2", "--seed", "1", "--json"],
                 store=store)
    assert out.code == 0, out.err
    report = json.loads(out.out)
    assert report["ok"] and report["duplicates"] == 0 and report["orphans"] == 0
    assert invoke(["drill", "--mcp"], store=store).code == 2
