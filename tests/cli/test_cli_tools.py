"""`--functions FILE.py` for ask and chat, with the built-in fake model calling the tools.

The offline fake calls a tool the request offers when the user writes
``NAME(JSON)``. The REPL test holds a tool open (it waits for a file) and
checks, while the tool runs, that the call it printed is already stored.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli_helpers import ReplSession, cli_env, invoke

from chatstate import Conversation, open_store

FUNCTIONS = '''
import time
from pathlib import Path

import chatstate
from json import dumps  # imported, so not a tool

GATE = Path(__file__).with_name("gate")


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@chatstate.tool(idempotent=False)
def send_email(to: str, body: str) -> str:
    """Send an email (never twice)."""
    return f"sent to {to}"


def wait_for_gate() -> str:
    """Block until the test opens the gate."""
    while not GATE.exists():
        time.sleep(0.02)
    return "gate opened"


def _helper() -> None:
    pass
'''


@pytest.fixture
def functions(tmp_path: Path) -> Path:
    path = tmp_path / "fns.py"
    path.write_text(FUNCTIONS)
    return path


def only(store: str) -> Conversation:
    s = open_store(store)
    try:
        (summary,) = s.list_conversations()
        conv: Conversation = s.load(summary.id)
        return conv
    finally:
        s.close()


def test_ask_runs_the_functions_and_describes_each_call(local_store_url: str,
                                                        functions: Path) -> None:
    prompt = 'get_weather({"city": "Paris"}) then send_email({"to": "ann@x.org", "body": "hi"})'
    result = invoke(["ask", "--model", "fake", "--functions", str(functions), prompt],
                    store=local_store_url)
    assert result.code == 0, result.err
    conv = only(local_store_url)
    ids = [c["id"] for c in conv.messages[1].tool_calls or ()]
    assert result.out == f"Tool results: {ids[0]}=sunny in Paris; {ids[1]}=sent to ann@x.org\n"
    lines = [line for line in result.err.splitlines() if line.startswith("tool")]
    assert lines == ['tool call> get_weather({"city": "Paris"})',
                     'tool call> send_email({"to": "ann@x.org", "body": "hi"})',
                     "tool result> sunny in Paris", "tool result> sent to ann@x.org"]
    assert [(m.role, m.status) for m in conv.messages] == [
        ("user", "complete"), ("assistant", "complete"), ("tool", "complete"),
        ("tool", "partial"), ("tool", "complete"), ("assistant", "complete")]
    assert conv.messages[3].content == "started"  # send_email is not idempotent


def test_the_tools_offered_are_the_files_public_functions(local_store_url: str,
                                                          functions: Path) -> None:
    from chatstate.cli.functions import load_functions

    tools = {t.name: t for t in load_functions([functions])}
    assert sorted(tools) == ["get_weather", "send_email", "wait_for_gate"]
    assert tools["send_email"].idempotent is False
    assert tools["get_weather"].idempotent


@pytest.mark.parametrize(("content", "error"), [
    (None, "no such file"),
    ("x = 1\n", "defines no functions"),
    ("def f(:\n", "running it failed: SyntaxError"),
    ("def f(*a):\n    pass\n", "*args"),
])
def test_a_bad_functions_file_is_a_usage_error(local_store_url: str, tmp_path: Path,
                                               content: str | None, error: str) -> None:
    path = tmp_path / "bad.py"
    if content is not None:
        path.write_text(content)
    result = invoke(["ask", "--model", "fake", "--functions", str(path), "hi"],
                    store=local_store_url)
    assert result.code == 2
    assert f"--functions {path}" in result.err
    assert error in result.err
    s = open_store(local_store_url)
    try:
        assert s.list_conversations() == []  # nothing was stored
    finally:
        s.close()


def test_the_repl_prints_each_call_once_it_is_stored(local_store_url: str, tmp_path: Path,
                                                     functions: Path) -> None:
    repl = ReplSession(local_store_url, cli_env(tmp_path), "--functions", str(functions))
    try:
        repl.prompt()
        repl.child.sendline("wait_for_gate()")
        repl.child.expect(r"tool call> wait_for_gate\(\{\}\)")
        # the tool is running (blocked on the gate): its call is already durable
        conv = only(local_store_url)
        assert conv.messages[-1].tool_calls is not None
        assert conv.messages[-1].tool_calls[0]["function"]["name"] == "wait_for_gate"
        (functions.parent / "gate").touch()
        repl.child.expect("tool result> gate opened")
        repl.child.expect(r"assistant> Tool results: call_\w+=gate opened")
        repl.prompt()
        result = only(local_store_url).messages[-2]
        assert (result.role, result.content) == ("tool", "gate opened")
        out = repl.command("/history", "assistant> Tool results")
        assert "tool call> wait_for_gate({})" in out
        assert repl.eof() == 0
    finally:
        repl.close()
    assert json.loads(conv.messages[-1].tool_calls[0]["function"]["arguments"]) == {}
