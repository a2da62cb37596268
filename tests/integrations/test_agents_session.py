"""ChatstateSession beyond the upstream tests: items round-trip JSON-identical (unknown
kinds included), pop/clear are events that replay shows and verify covers, events survive
export/import/migrate and never reach a model through Chat, and a call left without its
output is an interrupted turn on reopen, never handed to the SDK alone."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the Agents SDK is not installed (chatstate[agents])")

from chatstate.integrations._items import UNKNOWN_OUTPUT
from chatstate.integrations.agents import ChatstateSession

ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "input_text", "text": "Hi ✓"},
                                 {"type": "input_image", "image_url": "data:image/png;base64,"
                                  "iVBORw0KGgo=", "detail": "auto"}]},
    {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "…"}],
     "encrypted_content": "gAAA=="},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather",
     "arguments": "{\"city\": \"Paris\"}", "id": "fc_1", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "Sunny.", "annotations": [],
                  "logprobs": []}]},
    {"type": "a_kind_from_2030", "payload": {"nested": [1, 2.5, None, True, "ü"]},
     "big": 12345678901234567890},
]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_items_round_trip_json_identical(store_url: str) -> None:
    session = ChatstateSession("rt", store=store_url)
    run(session.add_items(ITEMS))
    reopened = ChatstateSession("rt", store=store_url)
    got = run(reopened.get_items())
    assert json.dumps(got, sort_keys=True) == json.dumps(ITEMS, sort_keys=True)
    conv = reopened.store.load("rt")
    assert conv.verify() is None
    assert len({m.turn_id for m in conv.messages}) == 1
    # derived fields: readable by replay and search, paired like the tool loop's
    assert conv.messages[0].role == "user"
    assert conv.messages[0].content == "Hi ✓"
    assert conv.messages[2].tool_calls == [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]
    assert conv.messages[3].role == "tool"
    assert conv.messages[3].tool_call_id == "call_1"
    session.close()
    reopened.close()


@pytest.mark.invariant(7)
def test_a_call_without_output_is_interrupted_and_never_handed_alone(store_url: str) -> None:
    session = ChatstateSession("orphan", store=store_url)
    run(session.add_items([ITEMS[0], ITEMS[2]]))  # the run died before the output
    reopened = ChatstateSession("orphan", store=store_url)
    assert reopened.open_calls() == [ITEMS[2]]
    # the same interrupted turn the tool loop sees in a transcript of its own
    from chatstate.session.tool_loop import pending_calls

    assert [p.call["id"] for p in pending_calls(reopened.store.load("orphan"))] == ["call_1"]
    got = run(reopened.get_items())
    assert got == [ITEMS[0], ITEMS[2], {"type": "function_call_output", "call_id": "call_1",
                                        "output": UNKNOWN_OUTPUT}]
    # an output whose call was popped is not handed back either
    run(reopened.add_items([ITEMS[3]]))
    assert reopened.open_calls() == []
    assert run(reopened.get_items())[-1] == ITEMS[3]
    session.close()
    reopened.close()


def _cli(store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "chatstate"
    return subprocess.run([str(exe), "--store", store_url, *args], capture_output=True,
                          text=True, timeout=120, check=False, env=os.environ.copy())


def test_events_in_replay_verify_and_export_import_migrate(store_url: str,
                                                          tmp_path: Path) -> None:
    session = ChatstateSession("ev", store=store_url)
    run(session.add_items(ITEMS[:2]))
    assert run(session.pop_item()) == ITEMS[1]
    run(session.clear_session())
    run(session.add_items([{"role": "user", "content": "after clear"}]))
    replay = _cli(store_url, "replay", "ev")
    assert replay.returncode == 0, replay.stderr
    assert "pop item seq 1" in replay.stdout
    assert "clear" in replay.stdout
    assert _cli(store_url, "replay", "ev", "--verify").returncode == 0

    dump = tmp_path / "ev.json"
    assert _cli(store_url, "export", "ev", "-o", str(dump)).returncode == 0
    other = f"sqlite://{tmp_path}/other.db"
    imported = _cli(other, "import", str(dump), "--id", "ev2")
    assert imported.returncode == 0, imported.stderr
    assert run(ChatstateSession("ev2", store=other).get_items()) == [
        {"role": "user", "content": "after clear"}]
    moved = f"json://{tmp_path}/moved"
    migrated = _cli(store_url, "migrate", "--from", store_url, "--to", moved)
    assert migrated.returncode == 0, migrated.stderr
    again = ChatstateSession("ev", store=moved)
    assert run(again.get_items()) == [{"role": "user", "content": "after clear"}]
    assert [m.role for m in again.store.load("ev").messages] == [
        "user", "assistant", "event", "event", "user"]
    session.close()


def test_chat_never_sends_events_to_the_model(tmp_path: Path) -> None:
    from chatstate import Chat
    from chatstate.testing import FakeModel

    url = f"sqlite://{tmp_path}/c.db"
    session = ChatstateSession("mixed", store=url)
    run(session.add_items([{"role": "user", "content": "kept"},
                           {"role": "assistant", "content": "popped"}]))
    run(session.pop_item())
    with FakeModel() as fake:
        chat = Chat(url, conversation_id="mixed", base_url=fake.base_url, api_key="k",
                    model="fake-model")
        chat.send("next")
        sent = fake.request_log[-1]["messages"]
    assert [m["content"] for m in sent] == ["kept", "next"]  # the popped reply is hidden
    assert not any("pop item" in str(m.get("content")) for m in sent)
    assert sent[-1]["content"] == "next"
    session.close()


def test_implements_the_sdk_session_protocol(store_url: str) -> None:
    from agents.memory import session as sdk

    session = ChatstateSession("proto", store=store_url, session_settings={"limit": 2})
    assert isinstance(session, sdk.Session)
    assert session.session_id == "proto"
    accepts = getattr(sdk, "_session_accepts_wrapper", None)  # SDKs that pass ``wrapper``
    if accepts is not None:
        assert accepts(session)
    run(session.add_items([{"role": "user", "content": str(i)} for i in range(3)]))
    assert [i["content"] for i in run(session.get_items(wrapper=object()))] == ["1", "2"]
    assert run(session.pop_item(wrapper=None)) == {"role": "user", "content": "2"}
    run(session.clear_session(wrapper=None))
    assert run(session.get_items(limit=None)) == []
    session.close()
