"""MCP tools in the tool loop, against real servers nobody here wrote (mcp-server-time,
the npm reference servers) and the suite's own server over Streamable HTTP: the calls
and results are stored, idempotency comes from the annotations (or the config), and
results are stored whole (text, structured content, images as blobs, resources)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.mcpservers import git_server, http_test_server, npm_server, suite_server, time_server

from chatstate import Chat, make_adapter, mcp_tools
from chatstate.core.content import BLOB_THRESHOLD
from chatstate.testing import FakeModel

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=2) as model:
        yield model


def chat_for(tmp_path: Path, fake: FakeModel) -> Chat:
    adapter = make_adapter(base_url=fake.base_url, api_key="k", model="fake-model")
    return Chat(f"sqlite://{tmp_path}/chat.db", adapter=adapter)


def turn(chat: Chat, fake: FakeModel, tools: Any, name: str, arguments: dict[str, Any],
         *, tag: str = "go") -> list[Any]:
    """One scripted turn calling ``name``; the messages it stored."""
    fake.add_tool_rule(contains=tag, calls=[{"name": name, "arguments": arguments}])
    before = len(chat.messages)
    chat.send(f"{tag} please", tools=tools)
    return chat.messages[before:]


def test_time_server_read_only_tool_runs_and_is_stored(tmp_path: Path, fake: FakeModel) -> None:
    with mcp_tools({"mcpServers": {"time": time_server()}}) as tools:
        by_name = {t.name: t for t in tools}
        assert by_name["get_current_time"].read_only and by_name["get_current_time"].idempotent
        chat = chat_for(tmp_path, fake)
        _user, asking, result, reply = turn(chat, fake, tools, "get_current_time",
                                           {"timezone": "Asia/Tokyo"})
    assert asking.tool_calls[0]["function"]["name"] == "get_current_time"
    assert result.status == "complete" and result.params == {"approval": "read-only"}
    assert json.loads(result.text)["timezone"] == "Asia/Tokyo"
    assert "Asia/Tokyo" in reply.text  # the model was sent the result
    assert chat.conversation.verify() is None


def test_memory_server_write_is_non_idempotent_with_a_durable_marker(
        tmp_path: Path, fake: FakeModel) -> None:
    memory = tmp_path / "memory.jsonl"
    entry = npm_server("server-memory", env={"MEMORY_FILE_PATH": str(memory)})
    with mcp_tools({"mcpServers": {"memory": entry}}) as tools:
        by_name = {t.name: t for t in tools}
        assert not by_name["create_entities"].idempotent  # no annotations: never twice
        assert by_name["read_graph"].idempotent  # readOnlyHint
        chat = chat_for(tmp_path, fake)
        stored = turn(chat, fake, tools, "create_entities", {"entities": [
            {"name": "Oslo", "entityType": "city", "observations": ["visited"]}]})
    marker, result = stored[2], stored[3]
    assert (marker.status, marker.content, marker.role) == ("partial", "started", "tool")
    assert result.status == "complete" and result.params == {"approval": "yes"}
    assert [json.loads(line)["name"] for line in memory.read_text().splitlines()] == ["Oslo"]


def test_git_server_commit_is_non_idempotent_and_lands(tmp_path: Path, fake: FakeModel) -> None:
    import subprocess

    repo = tmp_path / "repo"
    for args in (["init", "-q", str(repo)], ["-C", str(repo), "config", "user.email", "a@b"],
                 ["-C", str(repo), "config", "user.name", "A"]):
        subprocess.run(["git", *args], check=True)
    (repo / "a.txt").write_text("hi\n")
    subprocess.run(["git", "-C", str(repo), "add", "a.txt"], check=True)
    with mcp_tools({"mcpServers": {"git": git_server(repo)}}) as tools:
        by_name = {t.name: t for t in tools}
        assert by_name["git_status"].read_only
        assert not by_name["git_commit"].idempotent  # idempotentHint false: never twice
        chat = chat_for(tmp_path, fake)
        stored = turn(chat, fake, tools, "git_commit", {"repo_path": str(repo),
                                                        "message": "from the model"})
    assert stored[2].status == "partial" and stored[3].status == "complete"
    log = subprocess.run(["git", "-C", str(repo), "log", "--format=%s"], check=True,
                         capture_output=True, text=True).stdout
    assert log.splitlines() == ["from the model"]


def test_config_override_wins_over_annotations(tmp_path: Path) -> None:
    entry = {**npm_server("server-memory", env={"MEMORY_FILE_PATH": str(tmp_path / "m")}),
             "tools": {"create_entities": {"idempotent": True},
                       "read_graph": {"idempotent": False}}}
    with mcp_tools({"mcpServers": {"memory": entry}}) as tools:
        by_name = {t.name: t for t in tools}
    assert by_name["create_entities"].idempotent
    assert not by_name["read_graph"].idempotent


def test_filesystem_write_file_lands(tmp_path: Path, fake: FakeModel) -> None:
    root = tmp_path / "files"
    root.mkdir()
    entry = npm_server("server-filesystem", str(root))
    with mcp_tools({"mcpServers": {"fs": entry}}) as tools:
        by_name = {t.name: t for t in tools}
        assert by_name["write_file"].idempotent  # the server says idempotentHint: true
        assert not by_name["edit_file"].idempotent
        chat = chat_for(tmp_path, fake)
        stored = turn(chat, fake, tools, "write_file",
                      {"path": str(root / "note.txt"), "content": "hello"})
    assert (root / "note.txt").read_text() == "hello"
    assert stored[2].status == "complete"


def test_everything_image_structured_content_and_resource(
        tmp_path: Path, fake: FakeModel) -> None:
    with mcp_tools({"mcpServers": {"every": npm_server("server-everything")}}) as tools:
        chat = chat_for(tmp_path, fake)
        image = turn(chat, fake, tools, "get-tiny-image", {}, tag="img")[2]
        structured = turn(chat, fake, tools, "get-structured-content",
                          {"location": "New York"}, tag="weather")[2]
        resource = turn(chat, fake, tools, "get-resource-reference",
                        {"resourceType": "Text", "resourceId": 1}, tag="ref")[2]
    kinds = [p["type"] for p in image.content]
    assert "image_url" in kinds and "text" in kinds
    texts = [p["text"] for p in structured.content if p["type"] == "text"]
    assert any("temperature" in t for t in texts)
    assert any(p["type"] == "text" and p["text"].startswith("resource ")
               for p in resource.content), resource.content
    assert chat.conversation.verify() is None


def test_http_server_large_image_is_a_blob_and_headers_are_sent(
        tmp_path: Path, fake: FakeModel) -> None:
    with http_test_server(tmp_path / "effects") as url, mcp_tools(
            {"mcpServers": {"web": {"url": url, "headers": {"X-Team": "blue"}}}}) as tools:
        chat = chat_for(tmp_path, fake)
        header = turn(chat, fake, tools, "header", {"name": "x-team"}, tag="hdr")[-2]
        picture = turn(chat, fake, tools, "picture", {}, tag="pic")[-2]
    assert header.text == "blue"
    blob = next(p for p in picture.content if p["type"] == "image_url")
    assert blob["blob"]["size"] > BLOB_THRESHOLD and "url" not in blob["image_url"]
    assert any(p.get("text") == "resource file:///notes/readme.txt:\nhello"
               for p in picture.content)
    sent = fake.request_log[-1]["messages"]
    tool_msg = next(m for m in reversed(sent) if m["role"] == "tool")
    inline = next(p for p in tool_msg["content"] if p["type"] == "image_url")
    assert inline["image_url"]["url"].startswith("data:image/png;base64,")  # inlined again


def test_server_gets_the_call_id_in_meta(tmp_path: Path, fake: FakeModel) -> None:
    # the drill's tee reads it; a server can use it to notice a repeated call
    from chatstate.drill.mcptee import main  # noqa: F401 - the reader of that key
    from chatstate.tools_mcp.server import META_CALL_ID

    log = tmp_path / "calls"
    import sys

    entry = suite_server(tmp_path / "effects")
    entry = {"command": sys.executable, "args": ["-m", "chatstate.drill.mcptee", str(log),
                                                 "--", entry["command"], *entry["args"]]}
    with mcp_tools({"mcpServers": {"t": entry}}) as tools:
        chat = chat_for(tmp_path, fake)
        stored = turn(chat, fake, tools, "write_note", {"note": "a"})
    assert META_CALL_ID == "chatstate/tool_call_id"
    assert log.read_text().split() == [stored[1].tool_calls[0]["id"], "write_note"]
