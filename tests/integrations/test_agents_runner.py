"""A real Runner.run: an Agent whose model is OpenAIChatCompletionsModel talking over HTTP
to chatstate's fake model server, with ChatstateSession as its memory, on every store.
A tool call, a second turn that sees the first, and a SIGKILL in the middle of a run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest

pytest.importorskip("agents", reason="the Agents SDK is not installed (chatstate[agents])")

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from support import SUPPORT

from chatstate.integrations._items import UNKNOWN_OUTPUT
from chatstate.integrations.agents import ChatstateSession
from chatstate.testing import FakeModel

CHILD = SUPPORT / "agents_child.py"
set_tracing_disabled(True)  # nothing leaves 127.0.0.1


def agent_on(fake: FakeModel, tools: list[Any]) -> Agent[Any]:
    client = AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    return Agent(name="t", tools=tools,
                 model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client))


def test_tool_call_then_a_second_turn_that_sees_the_first(store_url: str) -> None:
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    with FakeModel() as fake:
        fake.add_tool_rule(contains="weather", calls=[{"name": "get_weather",
                                                       "arguments": {"city": "Paris"}}])
        agent = agent_on(fake, [get_weather])
        session = ChatstateSession("runner", store=store_url)

        async def two_turns() -> tuple[Any, Any]:  # one loop: the client's connections live in it
            first = await Runner.run(agent, "weather in Paris?", session=session)
            assert ran == ["Paris"]
            return first, await Runner.run(agent, "What did I ask?", session=session)

        first, second = asyncio.run(two_turns())
        assert "sunny in Paris" in first.final_output  # the fake read the result back
        assert second.final_output.startswith("Echo: What did I ask?")
        sent = fake.request_log[-1]["messages"]
    # the second request carried the first turn, tool call and result included
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert sent[0]["content"] == "weather in Paris?"
    assert sent[2]["content"] == "sunny in Paris"
    items = asyncio.run(ChatstateSession("runner", store=store_url).get_items())
    kinds = [i.get("type", "message") for i in items]
    assert kinds == ["message", "function_call", "function_call_output", "message",
                     "message", "message"]
    session.close()


def test_sigkill_mid_run_keeps_every_acknowledged_item_and_no_orphan(store_url: str) -> None:
    with FakeModel() as fake:
        fake.add_tool_rule(contains="lookup", calls=[{"name": "slow_lookup",
                                                      "arguments": {"city": "Oslo"}}])
        proc = subprocess.Popen([sys.executable, str(CHILD), store_url, "killed",
                                 fake.base_url, "lookup Oslo"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        acked: list[dict[str, Any]] = []
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            if line.startswith("ACK "):
                acked += json.loads(line[4:])
            if line.startswith("IN_TOOL") or time.monotonic() > deadline:
                break
        proc.kill()  # SIGKILL, in the middle of the tool
        rest, err = proc.communicate(timeout=60)
        assert proc.returncode == -9, err
        acked += [i for line in rest.splitlines() if line.startswith("ACK ")
                  for i in json.loads(line[4:])]
    reopened = ChatstateSession("killed", store=store_url)
    stored = reopened._log.items()
    assert acked
    assert all(item in stored for item in acked)  # nothing acknowledged lost
    items = asyncio.run(reopened.get_items())
    calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    assert calls == outputs  # no orphaned call or output reaches the SDK
    open_calls = reopened.open_calls()
    if any(i.get("type") == "function_call" for i in stored):  # the SDK saved the call
        assert [c["name"] for c in open_calls] == ["slow_lookup"]  # an interrupted turn
        assert {"type": "function_call_output", "call_id": open_calls[0]["call_id"],
                "output": UNKNOWN_OUTPUT} in items
    reopened.close()
