"""Helpers for the tests ported from openai-agents-python (see the ported files' headers).

``run_agent_async`` is copied from tests/memory/test_session.py and ``get_text_message``
re-creates tests/test_responses.py's helper of that name (not in the vendored copy),
at commit 7f7a44f8dc0650296bd5ab6c745c9bcbaa6ac3b7. MIT licence, Copyright (c) 2025 OpenAI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("agents", reason="the Agents SDK is not installed (chatstate[agents])")

from agents import Runner, set_tracing_disabled
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from chatstate.integrations.agents import ChatstateSession

set_tracing_disabled(True)  # traces would go to api.openai.com; nothing leaves 127.0.0.1

try:
    from agents.testing import ScriptedModel
except ImportError:  # older SDKs: the same in-process fake, from their own tests
    ScriptedModel = None  # type: ignore[assignment,misc]


def get_text_message(content: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="1", type="message", role="assistant",
        content=[ResponseOutputText(text=content, type="output_text", annotations=[],
                                    logprobs=[])],
        status="completed")


def _run_sync_wrapper(agent: Any, input_data: Any, **kwargs: Any) -> Any:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, input_data, **kwargs)
    finally:
        loop.close()


async def run_agent_async(runner_method: str, agent: Any, input_data: Any, **kwargs: Any) -> Any:
    if runner_method == "run":
        return await Runner.run(agent, input_data, **kwargs)
    if runner_method == "run_sync":
        return await asyncio.to_thread(_run_sync_wrapper, agent, input_data, **kwargs)
    if runner_method == "run_streamed":
        result = Runner.run_streamed(agent, input_data, **kwargs)
        async for _event in result.stream_events():
            pass
        return result
    raise ValueError(f"Unknown runner method: {runner_method}")


@pytest.fixture
def make_session(store_url: str) -> Iterator[Callable[..., ChatstateSession]]:
    """``make_session(session_id, **kw)``: a ChatstateSession on this test's store URL
    (each its own store object, as upstream opens each session on the same db path)."""
    made: list[ChatstateSession] = []

    def make(session_id: str = "test", **kw: Any) -> ChatstateSession:
        session = ChatstateSession(session_id, store=store_url, **kw)
        made.append(session)
        return session

    yield make
    for session in made:
        session.close()


def scripted_model() -> Any:
    if ScriptedModel is None:
        pytest.skip(reason="this SDK version has no agents.testing.ScriptedModel")
    return ScriptedModel()
