"""Coding agents people run every day, through ``chatstate serve`` in front of the fake
model: Codex CLI (OpenAI Responses, always streamed) and Claude Code (Anthropic Messages,
streamed, beta headers, thinking), each doing one task with a tool. The fake scripts the
tool call (a prompt that writes ``TOOL(JSON)`` for an offered tool gets that call), the
agent runs the tool and sends its result back, and every conversation is stored, verified
and holds the call and its result.

Installed once into an npm prefix under the test cache (tests/support/npmpkgs.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import cli_env, run_cli
from support.npmpkgs import npm_bin_dir
from support.serve_helpers import ServeProcess, serve_env

from chatstate.stores import open_store
from chatstate.testing import FakeModel

CODEX = ["@openai/codex@0.171.0"]
CLAUDE = ["@anthropic-ai/claude-code@2.1.197"]

pytestmark = pytest.mark.slow


def stored(url: str) -> list[Any]:
    store = open_store(url)
    try:
        return [store.load(s.id) for s in store.list_conversations()]
    finally:
        store.close()


def _tool_conversation(url: str, marker: str, tmp_path: Path) -> Any:
    convs = stored(url)
    assert convs and all(c.verify() is None for c in convs)
    for conv in convs:  # and replayed from a fresh process, as a user would check it
        replay = run_cli(["replay", conv.id, "--verify"], cli_env(tmp_path), store=url,
                         timeout=120)
        assert replay.code == 0, replay.err
    with_tool = [c for c in convs if any(m.role == "tool" and marker in (m.text or "")
                                         for m in c.messages)]
    assert len(with_tool) == 1, [[(m.role, (m.text or "")[:40]) for m in c.messages]
                                 for c in convs]
    return with_tool[0]


def test_codex_exec_runs_a_tool_through_serve(tmp_path: Path) -> None:
    bin_dir = npm_bin_dir(CODEX, tier="Codex CLI")
    url = f"sqlite://{tmp_path}/s.db"
    home = tmp_path / "codex-home"
    home.mkdir()
    prompt = 'exec_command({"cmd": "echo chatstate-codex-ok"})'
    with FakeModel(reply_words=4) as fake, \
            ServeProcess(url, fake.base_url, serve_env(tmp_path)) as proxy:
        env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(home)}
        provider = (f'model_providers.local={{name="local", base_url="{proxy.base_url}", '
                    'wire_api="responses"}')
        proc = subprocess.run(
            [str(bin_dir / "codex"), "exec", "--skip-git-repo-check",
             "--dangerously-bypass-approvals-and-sandbox", "-c", "model=fake-model",
             "-c", "model_provider=local", "-c", provider, "-c", "analytics.enabled=false",
             "-c", "features.plugins=false", "-c", "check_for_update_on_startup=false",
             "-c", 'web_search="disabled"', prompt],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
            stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr[-3000:] + proxy.stderr[-2000:]
        assert all(e["path"] == "/v1/responses" and e["stream"] for e in fake.request_log)
    conv = _tool_conversation(url, "chatstate-codex-ok", tmp_path)
    call = next(m for m in conv.messages if m.tool_calls)
    assert call.tool_calls and call.tool_calls[0]["function"]["name"] == "exec_command"
    assert conv.messages[-1].role == "assistant"
    assert conv.messages[-1].text.startswith("Tool results: ")
    assert "chatstate-codex-ok" in proc.stdout


def test_claude_code_runs_a_tool_through_serve(tmp_path: Path) -> None:
    bin_dir = npm_bin_dir(CLAUDE, tier="Claude Code")
    url = f"sqlite://{tmp_path}/s.db"
    home = tmp_path / "claude-home"
    home.mkdir()
    note = tmp_path / "note.txt"
    note.write_text("chatstate-claude-ok\n")
    prompt = f'Read({json.dumps({"file_path": str(note)})})'
    with FakeModel(reply_words=4) as fake, \
            ServeProcess(url, fake.base_url, serve_env(tmp_path)) as proxy:
        env = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": proxy.root,
               "ANTHROPIC_API_KEY": "dummy", "ANTHROPIC_MODEL": "fake-model",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "200"}
        proc = subprocess.run(
            [str(bin_dir / "claude"), "-p", prompt, "--bare", "--system-prompt", "be brief",
             "--allowedTools", "Read"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
            stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr[-3000:] + proxy.stderr[-2000:]
        assert all(e["path"].startswith("/v1/messages") for e in fake.request_log)
    conv = _tool_conversation(url, "chatstate-claude-ok", tmp_path)
    call = next(m for m in conv.messages if m.tool_calls)
    assert call.tool_calls and call.tool_calls[0]["function"]["name"] == "Read"
    assert "Tool results: " in proc.stdout
