"""The Agents SDK's default model (``OpenAIResponsesModel``) against ``chatstate serve``:
one script, run as a child process (``python -c AGENTS_SCRIPT BASE_URL TOKEN MODE``,
MODE ``run`` or ``run_streamed``), that runs an agent with a tool over two turns and
prints the final outputs and the versions as JSON.
"""

from __future__ import annotations

AGENTS_SCRIPT = r"""
import asyncio, json, sys
from agents import (Agent, Runner, function_tool, set_default_openai_api,
                    set_default_openai_client, set_tracing_disabled)
from openai import AsyncOpenAI
import agents, openai

set_default_openai_client(AsyncOpenAI(base_url=sys.argv[1], api_key=sys.argv[2],
                                      max_retries=0), use_for_tracing=False)
set_default_openai_api("responses")
set_tracing_disabled(True)
streamed = sys.argv[3] == "run_streamed"

@function_tool
def get_weather(city: str) -> str:
    "The weather in a city."
    return f"sunny in {city}"

async def run(agent, given):
    if not streamed:
        return await Runner.run(agent, given)
    result = Runner.run_streamed(agent, given)
    async for _ in result.stream_events():
        pass
    return result

async def main():
    agent = Agent(name="helper", instructions="be brief", tools=[get_weather],
                  model="fake-model")
    first = await run(agent, "what is the weather?")
    second = await run(agent, first.to_input_list() +
                       [{"role": "user", "content": "and tomorrow?"}])
    print(json.dumps({"first": first.final_output, "second": second.final_output,
                      "agents": agents.__version__, "openai": openai.__version__}))

asyncio.run(main())
"""
