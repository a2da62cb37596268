"""OpenAI Agents SDK with chatstate as its session: the one-line swap, a tool call, two turns.

    .venv/bin/python examples/agents_session.py [STORE_URL]

Needs the Agents SDK (``pip install 'chatstate[agents]'``). The agent's model is
OpenAIChatCompletionsModel pointed at chatstate's fake model server on 127.0.0.1,
scripted to call the tool, so it runs offline with no key. Every item the SDK adds
is durable and atomic per batch; a later process (or ``chatstate replay``) reads it.
"""

import asyncio
import sys

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from chatstate.integrations.agents import ChatstateSession
from chatstate.testing import FakeModel

set_tracing_disabled(True)  # nothing leaves 127.0.0.1
store = sys.argv[1] if len(sys.argv) > 1 else None  # None: CHATSTATE_STORE or the default


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def main(fake: FakeModel) -> None:
    fake.add_tool_rule(contains="weather", calls=[{"name": "get_weather",
                                                   "arguments": {"city": "Paris"}}])
    client = AsyncOpenAI(base_url=fake.base_url, api_key="offline", max_retries=0)
    agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client))

    session = ChatstateSession("agents-demo", store=store)  # the one-line swap
    first = await Runner.run(agent, "What is the weather in Paris?", session=session)
    print("assistant>", first.final_output)
    second = await Runner.run(agent, "Thanks! What did I ask?", session=session)
    print("assistant>", second.final_output)

    reopened = ChatstateSession("agents-demo", store=store)  # what a new process sees
    for item in await reopened.get_items():
        print("  ", item.get("type", "message"), item.get("role", ""),
              str(item.get("content") or item.get("arguments") or item.get("output"))[:60])
    conversation = reopened.store.load("agents-demo")
    verdict = "intact" if conversation.verify() is None else "BROKEN"
    print(f"session agents-demo: {len(conversation.messages)} messages, hash chain {verdict}")
    session.close()
    reopened.close()


with FakeModel() as fake_model:
    asyncio.run(main(fake_model))
