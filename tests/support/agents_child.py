"""A process that runs an Agents SDK turn over ChatstateSession and is SIGKILLed in it.

    python tests/support/agents_child.py STORE_URL SESSION_ID BASE_URL TEXT

Prints ``ACK <json items>`` after each add_items returns (acknowledged = durable), and
``IN_TOOL`` when the tool starts; the tool then blocks until the process is killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from chatstate.integrations.agents import ChatstateSession

set_tracing_disabled(True)


class AckingSession(ChatstateSession):
    async def add_items(self, items: list[Any], *, wrapper: Any = None) -> None:
        await super().add_items(items)
        print("ACK " + json.dumps(items), flush=True)


@function_tool
def slow_lookup(city: str) -> str:
    """Looks a city up, slowly."""
    print("IN_TOOL", flush=True)
    time.sleep(3600)
    return city


async def main(store: str, session_id: str, base_url: str, text: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    agent = Agent(name="t", tools=[slow_lookup],
                  model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client))
    await Runner.run(agent, text, session=AckingSession(session_id, store=store))
    print("DONE", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
