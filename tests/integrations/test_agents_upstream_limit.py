"""Ported from openai-agents-python tests/memory/test_session_limit.py.

Source: github.com/openai/openai-agents-python, commit
7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7 (vendored in shared/upstream/openai-agents-python).
MIT licence, Copyright (c) 2025 OpenAI; see that folder's LICENSE.

Changes: ``SQLiteSession`` became ``make_session`` (ChatstateSession on json, sqlite, s3).
"""

from __future__ import annotations

from typing import cast

import pytest
from agents import Agent, RunConfig
from agents.items import TResponseInputItem
from agents.memory import SessionSettings
from support.agents_port import get_text_message, make_session, run_agent_async, scripted_model

__all__ = ["make_session"]
RUNNERS = ["run", "run_sync", "run_streamed"]


@pytest.mark.parametrize("runner_method", RUNNERS)
@pytest.mark.asyncio
async def test_session_limit_parameter(runner_method, make_session):
    session = make_session("limit_test")
    model = scripted_model()
    agent = Agent(name="test", model=model)

    model.enqueue([get_text_message("Reply 1")])
    await run_agent_async(runner_method, agent, "Message 1", session=session)
    model.enqueue([get_text_message("Reply 2")])
    await run_agent_async(runner_method, agent, "Message 2", session=session)
    model.enqueue([get_text_message("Reply 3")])
    await run_agent_async(runner_method, agent, "Message 3", session=session)

    all_items = await session.get_items()
    assert len(all_items) == 6

    model.enqueue([get_text_message("Reply 4")])
    await run_agent_async(runner_method, agent, "Message 4", session=session,
                          run_config=RunConfig(session_settings=SessionSettings(limit=2)))
    last_input = model.calls[-1].input
    assert len(last_input) == 3
    assert last_input[0].get("content") == "Message 3"
    assert last_input[1].get("content")[0]["text"] == "Reply 3"
    assert last_input[2].get("content") == "Message 4"
    session.close()


@pytest.mark.parametrize("runner_method", RUNNERS)
@pytest.mark.asyncio
async def test_session_limit_drops_unmatched_history_function_call_output(runner_method,
                                                                          make_session):
    """A limit boundary must not pass an output whose matching call was excluded.

    chatstate goes one step further: ``get_items`` itself never hands back an output
    without its call (upstream's session returns it and the runner drops it), so
    ``get_items(limit=2)`` is ``history[-1:]`` here, not ``history[-2:]``.
    """
    session = make_session("limit_tool_pair")
    history = cast(list[TResponseInputItem], [
        {"role": "user", "content": "What is the weather?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}]},
    ])
    await session.add_items(history)

    assert await session.get_items(limit=2) == history[-1:]
    assert await session.get_items(limit=3) == history[-3:]

    model = scripted_model()
    model.enqueue([get_text_message("Tomorrow is sunny too.")])
    agent = Agent(name="test", model=model)
    await run_agent_async(runner_method, agent, "What about tomorrow?", session=session,
                          run_config=RunConfig(session_settings=SessionSettings(limit=2)))
    assert model.calls[-1].input == [
        history[-1],
        {"role": "user", "content": "What about tomorrow?"},
    ]
    session.close()


@pytest.mark.parametrize("runner_method", RUNNERS)
@pytest.mark.asyncio
async def test_session_limit_zero(runner_method, make_session):
    session = make_session("limit_zero_test")
    model = scripted_model()
    agent = Agent(name="test", model=model)
    model.enqueue([get_text_message("Reply 1")])
    await run_agent_async(runner_method, agent, "Message 1", session=session)
    model.enqueue([get_text_message("Reply 2")])
    await run_agent_async(runner_method, agent, "Message 2", session=session)

    model.enqueue([get_text_message("Reply 3")])
    await run_agent_async(runner_method, agent, "Message 3", session=session,
                          run_config=RunConfig(session_settings=SessionSettings(limit=0)))
    last_input = model.calls[-1].input
    assert len(last_input) == 1
    assert last_input[0].get("content") == "Message 3"
    session.close()


@pytest.mark.parametrize("runner_method", RUNNERS)
@pytest.mark.asyncio
async def test_session_limit_none_gets_all_history(runner_method, make_session):
    session = make_session("limit_none_test")
    model = scripted_model()
    agent = Agent(name="test", model=model)
    for i in range(1, 6):
        model.enqueue([get_text_message(f"Reply {i}")])
        await run_agent_async(runner_method, agent, f"Message {i}", session=session)

    all_items = await session.get_items()
    assert len(all_items) == 10

    model.enqueue([get_text_message("Reply 6")])
    await run_agent_async(runner_method, agent, "Message 6", session=session,
                          run_config=RunConfig(session_settings=SessionSettings(limit=None)))
    last_input = model.calls[-1].input
    assert len(last_input) == 11
    assert last_input[0].get("content") == "Message 1"
    assert last_input[-1].get("content") == "Message 6"
    session.close()


@pytest.mark.parametrize("runner_method", RUNNERS)
@pytest.mark.asyncio
async def test_session_limit_larger_than_history(runner_method, make_session):
    session = make_session("limit_large_test")
    model = scripted_model()
    agent = Agent(name="test", model=model)
    model.enqueue([get_text_message("Reply 1")])
    await run_agent_async(runner_method, agent, "Message 1", session=session)

    model.enqueue([get_text_message("Reply 2")])
    await run_agent_async(runner_method, agent, "Message 2", session=session,
                          run_config=RunConfig(session_settings=SessionSettings(limit=100)))
    last_input = model.calls[-1].input
    assert len(last_input) == 3
    assert last_input[0].get("content") == "Message 1"
    assert last_input[1].get("content")[0]["text"] == "Reply 1"
    assert last_input[2].get("content") == "Message 2"
    session.close()
