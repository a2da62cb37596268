"""The behaviours of openai-agents-python tests/utils/simple_session.py (SimpleListSession,
the SDK's in-memory reference session), asserted of ChatstateSession on every store.

Source: github.com/openai/openai-agents-python, commit
7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7 (vendored in shared/upstream/openai-agents-python).
MIT licence, Copyright (c) 2025 OpenAI; see that folder's LICENSE.

Not applicable: ``saved_items`` (the in-memory list itself), CountingSession's pop counter
(test instrumentation), and IdStrippingSession, which mimics hosted stores that drop item
ids: chatstate keeps every item verbatim, ids included (asserted below).
"""

from __future__ import annotations

import pytest
from support.agents_port import make_session

__all__ = ["make_session"]
pytestmark = pytest.mark.asyncio

HISTORY = [{"id": f"m{i}", "role": "user", "content": f"c{i}"} for i in range(4)]


async def test_get_items_none_is_everything_and_a_copy(make_session):
    session = make_session()
    await session.add_items(HISTORY)
    got = await session.get_items()
    assert got == HISTORY
    got.clear()
    got.append({"role": "user", "content": "not stored"})
    assert await session.get_items() == HISTORY


@pytest.mark.parametrize("limit", [0, -1, -5])
async def test_a_limit_of_zero_or_less_is_nothing(make_session, limit):
    session = make_session()
    await session.add_items(HISTORY)
    assert await session.get_items(limit=limit) == []


async def test_a_limit_is_the_latest_items_oldest_first(make_session):
    session = make_session()
    await session.add_items(HISTORY)
    assert await session.get_items(limit=3) == HISTORY[-3:]
    assert await session.get_items(limit=99) == HISTORY


async def test_add_items_extends_in_order(make_session):
    session = make_session()
    await session.add_items(HISTORY[:2])
    await session.add_items(HISTORY[2:])
    assert await session.get_items() == HISTORY


async def test_pop_item_returns_the_last_then_none(make_session):
    session = make_session()
    assert await session.pop_item() is None
    await session.add_items(HISTORY[:2])
    assert await session.pop_item() == HISTORY[1]
    assert await session.pop_item() == HISTORY[0]
    assert await session.pop_item() is None


async def test_clear_session_empties_it(make_session):
    session = make_session()
    await session.add_items(HISTORY)
    await session.clear_session()
    assert await session.get_items() == []
    await session.add_items(HISTORY[:1])
    assert await session.get_items() == HISTORY[:1]


async def test_ids_are_kept(make_session):
    session = make_session()
    await session.add_items(HISTORY)
    assert [item["id"] for item in await session.get_items()] == ["m0", "m1", "m2", "m3"]
