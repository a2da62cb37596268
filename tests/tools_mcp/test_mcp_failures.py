"""A server that crashes mid-call, one that hangs, one that answers isError, one that
never starts: each call gets a result the model is sent (``unknown`` for a tool with
side effects that the call reached, else an error), the conversation stays valid (the
chain verifies, every call has its result) and the next turn works."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.mcpservers import suite_server

from chatstate import Chat, make_adapter, mcp_tools
from chatstate.drill.tooldrill import orphans
from chatstate.testing import FakeModel

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=2) as model:
        yield model


def chat_for(tmp_path: Path, fake: FakeModel) -> Chat:
    adapter = make_adapter(base_url=fake.base_url, api_key="k", model="fake-model")
    return Chat(f"json://{tmp_path}/store", adapter=adapter)


def call(chat: Chat, fake: FakeModel, tools: Any, name: str, arguments: dict[str, Any],
         tag: str) -> Any:
    fake.add_tool_rule(contains=tag, calls=[{"name": name, "arguments": arguments}])
    chat.send(f"{tag} now", tools=tools)
    return next(m for m in reversed(chat.messages) if m.role == "tool")


def valid(chat: Chat) -> None:
    assert chat.conversation.verify() is None
    assert chat.interrupted is None
    sent = [m.to_openai() for m in chat.messages if m.status != "partial"]
    assert orphans(sent, allow_open_tail=False) == []


def test_crash_hang_and_error_each_answer_the_call(tmp_path: Path, fake: FakeModel) -> None:
    effects = tmp_path / "effects"
    lines: list[str] = []
    cfg = {"mcpServers": {"bad": suite_server(effects),
                          "slow": suite_server(tmp_path / "unused", timeout=1.5)}}
    with mcp_tools(cfg, on_event=lines.append) as tools:
        chat = chat_for(tmp_path, fake)
        crashed = call(chat, fake, tools, "bad_crash", {}, "crash")
        # it reached a tool with side effects (no read-only annotation): it may have done
        # its work, so "unknown", not a failure the model would run again
        assert crashed.status == "unknown" and "went away during the call to crash" in \
            crashed.text and "may or may not have run" in crashed.text
        valid(chat)
        # the next call starts the server again
        assert call(chat, fake, tools, "bad_write_note", {"note": "a"}, "note").text == "noted a"
        began = time.monotonic()
        hung = call(chat, fake, tools, "slow_hang", {}, "hang")
        assert time.monotonic() - began < 10
        assert hung.status == "unknown" and "did not answer within 1.5 s" in hung.text
        valid(chat)
        failed = call(chat, fake, tools, "bad_fail", {"why": "x"}, "fail")
        assert failed.status == "error"  # isError is stored as a tool error
        valid(chat)
        # the model was sent each failure as the call's result
        assert "went away" in fake.request_log[1]["messages"][-1]["content"]
        assert call(chat, fake, tools, "bad_write_note", {"note": "b"}, "more").text == "noted b"
    assert effects.read_text() == "a\nb\n"
    assert lines == []  # a failing call is told in its result, not as a server line
    valid(chat)


def test_a_server_that_does_not_start_says_so_once(tmp_path: Path, fake: FakeModel) -> None:
    lines: list[str] = []
    cfg = {"mcpServers": {"gone": {"command": "/nonexistent/mcp-server"},
                          "bad": suite_server(tmp_path / "effects")}}
    with mcp_tools(cfg, on_event=lines.append) as tools:
        names = {t.name for t in tools}
        assert "write_note" in names  # the other server's tools still work
        chat = chat_for(tmp_path, fake)
        result = call(chat, fake, tools, "write_note", {"note": "a"}, "note")
        assert result.status == "complete", result.content
        list(tools)
    assert len(lines) == 1 and "MCP server 'gone'" in lines[0] and "failed to start" in lines[0]
    assert "/nonexistent/mcp-server" in lines[0]


def test_start_timeout_is_one_clear_line(tmp_path: Path) -> None:
    lines: list[str] = []
    sleeper = {"command": "sleep", "args": ["30"], "startTimeout": 1}
    began = time.monotonic()
    with mcp_tools({"mcpServers": {"slow": sleeper}}, on_event=lines.append) as tools:
        assert list(tools) == []
    assert time.monotonic() - began < 10
    assert lines == ["mcp: MCP server 'slow' (sleep 30) did not start within 1 s "
                     "(startTimeout)"]


def test_an_argument_named_self_reaches_the_server(tmp_path: Path, fake: FakeModel) -> None:
    # the call raised "TypeError: McpTool._run() got multiple values for argument 'self'"
    with mcp_tools({"mcpServers": {"bad": suite_server(tmp_path / "effects")}}) as tools:
        chat = chat_for(tmp_path, fake)
        result = call(chat, fake, tools, "receiver", {"self": "x"}, "receive")
        assert (result.status, result.text) == ("complete", "self is x"), result.content
