"""The examples the README quotes run, as scripts, and leave the transcripts they claim."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chatstate import Conversation, open_store
from chatstate.testing import FakeModel

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(script: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
    result = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd,
                            env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result


def conversations(url: str) -> list[Conversation]:
    store = open_store(url)
    try:
        convs = [store.load(s.id) for s in store.list_conversations()]
    finally:
        store.close()
    for conv in convs:
        assert conv.verify() is None
    return convs


def shape(conv: Conversation) -> list[tuple[str, str]]:
    return [(m.role, m.status) for m in conv.messages]


TURN = [("user", "complete"), ("assistant", "complete")]


def test_quickstart(local_store_url: str, tmp_path: Path) -> None:
    out = run("quickstart.py", local_store_url, cwd=tmp_path).stdout
    assert f"store {local_store_url}: durable" in out
    assert "assistant> Echo: What does chatstate promise?" in out
    assert "4 messages, hash chain intact" in out
    (conv,) = conversations(local_store_url)
    assert shape(conv) == TURN * 2
    assert f"conversation {conv.id}:" in out
    for message in conv.messages:  # the replay printed what the store holds
        assert f"[{message.seq}] {message.role}: {message.content}" in out


def test_quickstart_uses_the_configured_endpoint_and_store(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/env.db"
    with FakeModel() as model:
        out = run("quickstart.py", cwd=tmp_path, CHATSTATE_STORE=url,
                  CHATSTATE_BASE_URL=model.base_url).stdout
        requests = [e for e in model.request_log if e["path"] == "/v1/chat/completions"]
    assert [r["stream"] for r in requests] == [False, True]
    (conv,) = conversations(url)
    assert conv.messages[-1].content in out


def test_resume_interrupted(local_store_url: str, tmp_path: Path) -> None:
    out = run("resume_interrupted.py", local_store_url, cwd=tmp_path).stdout
    assert "failed: model request" in out
    assert "cut off after" in out and "(kept as partial)" in out
    (conv,) = conversations(local_store_url)
    user, partial, reply = conv.messages
    assert shape(conv) == [("user", "complete"), ("assistant", "partial"),
                           ("assistant", "complete")]
    assert user.turn_id == partial.turn_id == reply.turn_id
    assert reply.content.startswith(partial.content)
    assert f"retried> {reply.content}" in out


def test_async_chat(local_store_url: str, tmp_path: Path) -> None:
    out = run("async_chat.py", local_store_url, cwd=tmp_path).stdout
    convs = conversations(local_store_url)
    assert len(convs) == 2
    for conv in convs:
        assert shape(conv) == TURN * 2
        assert f"{conv.id}: 4 messages, last reply {conv.messages[-1].content!r}" in out


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_is_short_and_documented(script: str) -> None:
    text = (EXAMPLES / script).read_text()
    assert text.startswith('"""') and f"python examples/{script}" in text
    assert len(text.splitlines()) <= 60, "examples are quoted in the README: keep them short"


def test_tools(local_store_url: str, tmp_path: Path) -> None:
    out = run("tools.py", local_store_url, cwd=tmp_path).stdout
    assert "  tool call   get_weather(" in out and "  tool call   send_email(" in out
    assert "(interrupted while send_email ran)" in out
    assert "send_email (call_" in out and ", started)" in out
    assert "12 messages, chain intact: True" in out
    (conv,) = conversations(local_store_url)
    tools = [("tool", "complete"), ("tool", "partial")]  # a result; send_email's marker
    assert shape(conv) == [("user", "complete"), ("assistant", "complete"), *tools,
                           ("tool", "complete"), ("assistant", "complete"),
                           ("user", "complete"), ("assistant", "complete"), *tools,
                           ("tool", "unknown"), ("assistant", "complete")]
    assert conv.messages[-1].content.endswith("may or may not have run; it was not run again")


def test_the_tools_page_example_runs(local_store_url: str, tmp_path: Path) -> None:
    """docs/tools.md's first Python block, run as it is written."""
    page = (EXAMPLES.parent / "docs" / "tools.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "page_example.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={
                                **{k: v for k, v in os.environ.items()
                                   if not k.startswith(("CHATSTATE_", "OPENAI_"))},
                                "CHATSTATE_STORE": local_store_url})
    assert result.returncode == 0, result.stderr
    assert "tool call> get_weather" in result.stdout
    assert "assistant> Tool results: call_" in result.stdout
    (conv,) = conversations(local_store_url)
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
