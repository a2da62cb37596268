"""MCP servers from the command line: `--mcp-config`, `CHATSTATE_MCP_CONFIG`, `--mcp`,
approvals (`ask` needs --yes or the allow-list; the REPL asks y / n / always), the
decision stored with the result, and `/tools` listing servers and tools, `/tools off`.

The built-in fake model calls a tool the request offers when the message writes
``NAME(JSON)``; the server is npm's server-memory (its create_entities has no
annotations: non-idempotent, so it asks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.cli_helpers import invoke
from support.mcpservers import npm_server, time_server

from chatstate import Conversation, open_store


def note(name: str) -> str:
    entity = {"name": name, "entityType": "note", "observations": []}
    return f"create_entities({json.dumps({'entities': [entity]})})"


NOTE = note("n1")


def config(tmp_path: Path, **entry: Any) -> Path:
    path = tmp_path / "mcp.json"
    memory = npm_server("server-memory", env={"MEMORY_FILE_PATH": str(tmp_path / "effects")})
    path.write_text(json.dumps({"mcpServers": {"notes": {**memory, **entry}}}))
    return path


def only(store: str) -> Conversation:
    s = open_store(store)
    try:
        (summary,) = s.list_conversations()
        conv: Conversation = s.load(summary.id)
    finally:
        s.close()
    assert conv.verify() is None
    return conv


def result_of(conv: Conversation) -> Any:
    return next(m for m in reversed(conv.messages) if m.role == "tool" and
                m.status != "partial")


def effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["name"] for line in lines]


def test_ask_runs_a_writing_tool_only_with_yes_or_the_allow_list(tmp_path: Path) -> None:
    stores = [f"sqlite://{tmp_path}/{n}.db" for n in "abc"]
    refused = invoke(["ask", "--model", "fake", "--mcp-config", str(config(tmp_path)), NOTE],
                     store=stores[0])
    assert refused.code == 0, refused.err
    answer = result_of(only(stores[0]))
    assert answer.status == "error" and answer.text.startswith(
        "not run: create_entities is not on the allow-list")
    assert answer.params == {"approval": answer.text.removeprefix("not run: ")}
    assert "tool result (error)> not run" in refused.err
    assert effects(tmp_path) == []
    yes = invoke(["ask", "--model", "fake", "--yes", "--mcp-config", str(config(tmp_path)),
                  NOTE], store=stores[1])
    assert yes.code == 0, yes.err
    assert result_of(only(stores[1])).params == {"approval": "yes"}
    assert '"name": "n1"' in result_of(only(stores[1])).text
    # the config's allow-list, the config named by the environment
    (tmp_path / "effects").unlink()
    listed = config(tmp_path, allow=["create_entities"])
    allowed = invoke(["ask", "--model", "fake", NOTE], store=stores[2],
                     env={"CHATSTATE_MCP_CONFIG": str(listed)})
    assert allowed.code == 0, allowed.err
    assert result_of(only(stores[2])).params == {"approval": "allow-list"}
    assert effects(tmp_path) == ["n1"]


def test_mcp_names_one_server_on_the_command_line(tmp_path: Path) -> None:
    server = time_server()
    command = " ".join([server["command"], *server["args"]])
    store = f"sqlite://{tmp_path}/a.db"
    result = invoke(["ask", "--model", "fake", "--mcp", command,
                     'get_current_time({"timezone": "Europe/Oslo"})'], store=store)
    assert result.code == 0, result.err
    answer = result_of(only(store))
    assert answer.params == {"approval": "read-only"} and "Europe/Oslo" in answer.text


def test_two_mcp_of_one_server_get_tools_of_their_own(tmp_path: Path) -> None:
    # the same server twice (two repositories of mcp-server-git): both were named after
    # the command, their tools clashed, and every turn failed once its message was stored
    server = time_server()
    command = " ".join([server["command"], *server["args"]])
    store = f"sqlite://{tmp_path}/a.db"
    result = invoke(["ask", "--model", "fake", "--mcp", command, "--mcp", command,
                     'get_current_time({"timezone": "Europe/Oslo"})'], store=store)
    assert result.code == 0, result.err
    assert "must be unique" not in result.err
    conv = only(store)
    assert conv.messages[-1].role == "assistant" and conv.messages[-1].status == "complete"


def test_bad_config_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"servers": {}}')
    result = invoke(["ask", "--model", "fake", "--mcp-config", str(bad), "hi"],
                    store=f"sqlite://{tmp_path}/a.db")
    assert result.code == 2
    assert str(bad) in result.err and "mcpServers" in result.err


def test_repl_asks_y_n_always_and_lists_tools(tmp_path: Path) -> None:
    store = f"sqlite://{tmp_path}/a.db"
    lines = ["/tools", NOTE, "n", note("n2"), "y", note("n3"), "always", note("n4"),
             "/tools off", "/tools", note("n5"), ""]
    result = invoke(["chat", "--model", "fake", "--mcp-config", str(config(tmp_path))],
                    store=store, input="\n".join(lines))
    assert result.code == 0, result.err
    assert "mcp server notes (stdio: " in result.err and "): running" in result.err
    assert "  create_entities (asks first, never run twice): Create multiple" in result.err
    assert "  read_graph (read-only, idempotent): " in result.err
    assert result.err.count("run MCP tool create_entities of notes(") == 3  # n4: "always"
    conv = only(store)
    verdicts = [m.params["approval"] for m in conv.messages
                if m.role == "tool" and m.status != "partial"]
    assert verdicts == ["the user declined to run it", "user: yes",
                        "always (this conversation)", "always (this conversation)"]
    assert effects(tmp_path) == ["n2", "n3", "n4"]
    assert "tools off: the next messages offer no tools" in result.err
    assert "(off: /tools on offers them again)" in result.err
    last = conv.messages[-1]
    assert last.role == "assistant" and not last.tool_calls  # n5: no tools offered


def test_batch_runs_only_allow_listed_tools(tmp_path: Path) -> None:
    records = [{"id": "a", "text": note("listed")},
               {"id": "b", "text": 'add_observations({"observations": []})'}]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    store = f"sqlite://{tmp_path}/t.db"
    listed = config(tmp_path, allow=["create_entities"])
    args = ["batch", "run", str(source), "--prompt", "{text}", "--out", str(tmp_path / "out"),
            "--model", "fake",
            "--mcp-config", str(listed)]
    refused = invoke(args, store=store)
    assert refused.code == 2 and "--transcripts" in refused.err  # the loop must be stored
    result = invoke([*args, "--transcripts"], store=store)
    assert result.code == 0, result.err
    assert effects(tmp_path) == ["listed"]
    s = open_store(store)
    try:
        convs = [s.load(c.id) for c in s.list_conversations()]
    finally:
        s.close()
    verdicts = sorted(str(m.params["approval"]) for c in convs for m in c.messages
                      if m.role == "tool" and m.status != "partial")
    assert verdicts[1] == "allow-list"
    assert verdicts[0].startswith("add_observations is not on the allow-list")


def test_servers_are_stopped_when_the_command_ends(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    fs = npm_server("server-filesystem", str(root))
    command = " ".join([fs["command"], *fs["args"]])
    result = invoke(["ask", "--model", "fake", "--mcp", command,
                     'list_allowed_directories({})'], store=f"sqlite://{tmp_path}/a.db")
    assert result.code == 0, result.err
    assert str(root) in result.out  # the server ran and answered
    assert running_with(str(root)) == []


def running_with(arg: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and arg.encode() in cmdline:
            found.append(proc.name)
    return found


def test_ctrl_c_during_a_call_stops_the_servers_and_keeps_the_transcript(tmp_path: Path) -> None:
    """SIGINT while a tool hangs: `ask` exits at once (no hang), the MCP server process is
    gone, and the stored turn is a valid interrupted one (its call marked started)."""
    import signal
    import subprocess
    import time

    from support.cli_helpers import CHATSTATE, cli_env
    from support.mcpservers import suite_server

    marker = tmp_path / "effects-ctrl-c.txt"
    server = suite_server(marker)
    command = " ".join([server["command"], *server["args"]])
    store = f"sqlite://{tmp_path}/a.db"
    proc = subprocess.Popen([CHATSTATE, "--store", store, "ask", "--model", "fake", "--yes",
                             "--id", "k", "--mcp", command, "hang({})"],
                            env=cli_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not running_with(str(marker)):  # the server is up ...
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        conv_deadline = time.monotonic() + 30
        while True:  # ... and the call has started (its marker is durable)
            # (the servers start before the turn writes: there may be no conversation yet)
            probe = open_store(store)
            try:
                stored = probe.list_conversations() if proc.poll() is None else []
            finally:
                probe.close()
            conv = only(store) if stored else None
            if conv is not None and any(m.role == "tool" for m in conv.messages):
                break
            assert time.monotonic() < conv_deadline, "the call never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, err
    stopped = time.monotonic() + 10
    while running_with(str(marker)) and time.monotonic() < stopped:
        time.sleep(0.05)
    assert running_with(str(marker)) == [], "the MCP server outlived the command"
    conv = only(store)
    assert conv.verify() is None
    [started] = [m for m in conv.messages if m.role == "tool"]
    assert started.status == "partial"  # the started marker: never run twice on recovery
