"""`chatstate drill --tools` through the CLI: it kills tool-loop writers at every step,
finds no duplicated side effect and no orphaned call, leaves the user's conversations
alone and deletes its own; and its orphan check does see orphans.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli_helpers import invoke

from chatstate import Conversation
from chatstate.drill.tooldrill import effect_counts, orphans
from chatstate.drill.toolwriter import STEPS
from chatstate.stores import open_store

pytestmark = pytest.mark.slow


@pytest.mark.invariant(4, 7)
@pytest.mark.usefixtures("no_model_settings_from_env")
def test_tool_drill_kills_at_every_step_and_finds_nothing_wrong(store_url: str) -> None:
    store = open_store(store_url)
    try:
        store.create(Conversation(id="mine", title="keep me"))
    finally:
        store.close()
    result = invoke(["drill", "--tools", "--trials", "21", "--seed", "5", "--json"],
                    store=store_url)
    assert result.code == 0, result.out + result.err
    doc = result.json()
    assert doc["ok"]
    assert doc["kills"] == 21
    assert doc["seed"] == 5
    assert doc["duplicates"] == 0
    assert doc["orphans"] == 0
    assert doc["lost"] == 0
    assert doc["problems"] == []
    assert all(doc["steps"].get(step, 0) >= 1 for step in STEPS), doc["steps"]
    assert doc["calls"] > 0
    assert doc["tool_runs"] > 0
    assert doc["requests"] > 0
    store = open_store(store_url)
    try:
        assert [c.id for c in store.list_conversations()] == ["mine"]  # the drill's is gone
    finally:
        store.close()


def test_the_orphan_check_sees_both_directions() -> None:
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "f", "arguments": "{}"}}]}
    answer = {"role": "tool", "tool_call_id": "c1", "content": "r"}
    user = {"role": "user", "content": "q"}
    assert orphans([user, call, answer, user], allow_open_tail=False) == []
    assert orphans([user, call], allow_open_tail=True) == []
    assert orphans([user, call], allow_open_tail=False) != []
    assert orphans([user, call, user], allow_open_tail=True) != []  # open, then moved on
    assert orphans([user, answer], allow_open_tail=True) != []
    assert orphans([user, call, answer, answer], allow_open_tail=True) != []


def test_effect_counts(tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    assert effect_counts(effects) == {}
    effects.write_text("c1 a\nc2 a\nc1 a\n")
    assert effect_counts(effects) == {"c1": 2, "c2": 1}
