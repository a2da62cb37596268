"""A coding agent's second session continues the stored conversation through serve: Codex
CLI's ``codex exec resume --last`` and Claude Code's ``claude -p --continue`` re-send the
whole history (neither uses ``previous_response_id``), and serve appends the new turn to
the one conversation instead of starting another or storing the history twice.

Same pinned packages and cached npm prefix as test_serve_coding_agents.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import cli_env, run_cli
from support.npmpkgs import npm_bin_dir
from support.serve_helpers import ServeProcess, serve_env
from test_serve_coding_agents import CLAUDE, CODEX

from chatstate.stores import open_store
from chatstate.testing import FakeModel

pytestmark = pytest.mark.slow


def _conversations(url: str, tmp_path: Path) -> list[Any]:
    """Every stored conversation, each also replayed with ``--verify`` from a fresh process."""
    store = open_store(url)
    try:
        convs = [store.load(s.id) for s in store.list_conversations()]
    finally:
        store.close()
    for conv in convs:
        replay = run_cli(["replay", conv.id, "--verify"], cli_env(tmp_path), store=url,
                         timeout=120)
        assert replay.code == 0, replay.err
    return convs


def _dump(convs: list[Any]) -> list[list[tuple[str, str]]]:
    return [[(m.role, m.text) for m in c.messages] for c in convs]


def _users(conv: Any) -> list[str]:
    return [m.text for m in conv.messages if m.role == "user"]


def test_codex_exec_resume_continues_the_stored_conversation(tmp_path: Path) -> None:
    bin_dir = npm_bin_dir(CODEX, tier="Codex CLI")
    url = f"sqlite://{tmp_path}/s.db"
    home = tmp_path / "codex-home"
    home.mkdir()
    with FakeModel(reply_words=4) as fake, \
            ServeProcess(url, fake.base_url, serve_env(tmp_path)) as proxy:
        env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(home)}
        provider = (f'model_providers.local={{name="local", base_url="{proxy.base_url}", '
                    'wire_api="responses"}')
        common = ["--skip-git-repo-check", "-c", "model=fake-model", "-c",
                  "model_provider=local", "-c", provider, "-c", "analytics.enabled=false",
                  "-c", "features.plugins=false", "-c", "check_for_update_on_startup=false",
                  "-c", 'web_search="disabled"']
        for args in (["first question"], ["resume", "--last", "second question"]):
            proc = subprocess.run([str(bin_dir / "codex"), "exec", *common, *args], env=env,
                                  cwd=tmp_path, capture_output=True, text=True, timeout=180,
                                  check=False, stdin=subprocess.DEVNULL)
            assert proc.returncode == 0, proc.stderr[-3000:] + proxy.stderr[-2000:]
    convs = _conversations(url, tmp_path)
    assert len(convs) == 1, _dump(convs)
    conv = convs[0]
    users = _users(conv)
    assert users.count("first question") == 1 and users.count("second question") == 1
    assert users[-1] == "second question"
    assert [m.role for m in conv.messages[-4:]] == ["user", "assistant"] * 2
    assert conv.messages[-1].text.startswith("Echo: second question")


def test_claude_code_continue_continues_the_stored_conversation(tmp_path: Path) -> None:
    bin_dir = npm_bin_dir(CLAUDE, tier="Claude Code")
    url = f"sqlite://{tmp_path}/s.db"
    home = tmp_path / "claude-home"
    home.mkdir()
    with FakeModel(reply_words=4) as fake, \
            ServeProcess(url, fake.base_url, serve_env(tmp_path)) as proxy:
        env = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": proxy.root,
               "ANTHROPIC_API_KEY": "dummy", "ANTHROPIC_MODEL": "fake-model",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "200"}
        for args in (["-p", "first question"], ["-p", "--continue", "second question"]):
            proc = subprocess.run([str(bin_dir / "claude"), *args, "--bare",
                                   "--system-prompt", "be brief"], env=env, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=180, check=False,
                                  stdin=subprocess.DEVNULL)
            assert proc.returncode == 0, proc.stderr[-3000:] + proxy.stderr[-2000:]
    convs = _conversations(url, tmp_path)
    (conv,) = [c for c in convs if _users(c)[-1:] == ["second question"]]
    users = _users(conv)
    # Claude Code puts its context reminder in the first user message, with the prompt
    assert len(users) == 2 and "first question" in users[0]
    assert [m.role for m in conv.messages if m.role != "system"] == ["user", "assistant"] * 2
    assert conv.messages[-1].text.startswith("Echo: second question")
    answers = [m.text for c in convs for m in c.messages
               if m.role == "assistant" and "first question" in m.text]
    assert len(answers) == 1, _dump(convs)  # the first session's reply, stored once
    resent = next(m.text for m in conv.messages if m.role == "assistant")
    if resent == answers[0]:
        assert len(convs) == 1, _dump(convs)  # the history came back as stored: continued
    else:
        # Claude Code sometimes resumes with its own "No response requested." in place of
        # the reply (its session file lost the race with its exit): the history diverged,
        # so serve keeps it as a conversation of its own and the first one is untouched
        assert len(convs) == 2 and answers[0] not in [m.text for m in conv.messages], \
            _dump(convs)
