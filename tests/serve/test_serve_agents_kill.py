"""The Agents SDK's default model (``OpenAIResponsesModel``) through serve, with serve
killed (SIGKILL) in the middle of a run and the run started again against a restarted
serve on the same store.

``Runner.run`` asks for a tool call, runs the tool, sends its output, and then takes a
second turn: the kill comes while the request that carries the tool's output is in
flight (upstream still thinking, for ``Runner.run``'s plain requests; half-way through
the streamed answer, for ``Runner.run_streamed``). The rerun sends the whole run again:
serve answers the requests it has answered from the store and sends the interrupted
one upstream again under its turn, so the stored conversation ends complete, verified
(``replay --verify``), with every turn once: no second user message, tool call, tool
output or answer. The Agents SDK is in the dev venv (as in test_serve_dialects).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import cli_env, run_cli
from support.serve_helpers import ServeProcess, serve_env

from chatstate.stores import open_store
from chatstate.testing import FakeModel

pytestmark = pytest.mark.slow

TOKEN = "tok-agents-kill-0123456789abcdef01234567"

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

EXPECTED = ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]


def _conversations(url: str) -> list[Any]:
    store = open_store(url)
    try:
        return [store.load(s.id) for s in store.list_conversations()]
    finally:
        store.close()


def _agent(base_url: str, mode: str, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", AGENTS_SCRIPT, base_url, TOKEN, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=serve_env(tmp_path))


def _in_flight(fake: FakeModel, url: str, mode: str) -> bool:
    """The request carrying the tool's output is upstream (and, streamed, half-relayed)."""
    if mode == "run":
        return len(fake.request_log) >= 2
    return any(c.partial is not None and c.partial.text and
               any(m.role == "tool" for m in c.messages) for c in _conversations(url))


@pytest.mark.parametrize("mode", ["run", "run_streamed"])
def test_agents_sdk_run_survives_a_kill_9_of_serve_and_a_rerun_without_duplicates(
        tmp_path: Path, mode: str) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    env = serve_env(tmp_path)
    with FakeModel(reply_words=6) as fake:
        fake.add_tool_rule(contains="weather", calls=[
            {"name": "get_weather", "arguments": {"city": "Paris"}}])
        if mode == "run":
            fake.hang_next(0.0)  # the tool call comes at once; its answer takes its time
            fake.hang_next(120.0)
        else:
            fake.configure(chunk_delay=0.25)
        proxy = ServeProcess(url, fake.base_url, env, "--token", TOKEN)
        agent = _agent(proxy.base_url, mode, tmp_path)
        try:
            deadline = time.monotonic() + 60
            while not _in_flight(fake, url, mode):
                assert agent.poll() is None and time.monotonic() < deadline, \
                    agent.communicate()[1][-3000:] + proxy.stderr
                time.sleep(0.05)
            proxy.kill()
            _, err = agent.communicate(timeout=60)
            assert agent.returncode != 0, "the run went on without serve"
        finally:
            proxy.stop()
            if agent.poll() is None:
                agent.kill()
        upstream_before = len(fake.request_log)
        fake.reset()
        fake.configure(chunk_delay=0.0)
        fake.add_tool_rule(contains="weather", calls=[
            {"name": "get_weather", "arguments": {"city": "Paris"}}])
        with ServeProcess(url, fake.base_url, env, "--token", TOKEN) as again:
            rerun = _agent(again.base_url, mode, tmp_path)
            out_text, err = rerun.communicate(timeout=180)
            assert rerun.returncode == 0, err[-3000:] + again.stderr
        upstream_after = fake.request_log
    out = json.loads(out_text.strip().splitlines()[-1])
    assert out["first"].startswith("Tool results: ") and out["first"].endswith("sunny in Paris")
    assert out["second"].startswith("Echo: and tomorrow?")
    assert upstream_before == 2
    # the tool call was answered from the store: upstream saw the interrupted request
    # again, then the second turn
    assert [[m["role"] for m in e["messages"]] for e in upstream_after] == [
        EXPECTED[:4], EXPECTED[:6]]
    convs = _conversations(url)
    assert len(convs) == 1, [[(m.role, m.text) for m in c.messages] for c in convs]
    conv = convs[0]
    complete = [m for m in conv.messages if m.status == "complete"]
    assert [m.role for m in complete] == EXPECTED
    assert complete[2].tool_calls and complete[4].text == out["first"]
    assert complete[-1].text == out["second"] and conv.partial is None
    cut = [m for m in conv.messages if m.status != "complete"]
    assert all(m.role == "assistant" and out["first"].startswith(m.text) for m in cut)
    assert len(cut) == (1 if mode == "run_streamed" else 0)  # what the client had, kept
    replay = run_cli(["replay", conv.id, "--verify"], cli_env(tmp_path), store=url,
                     timeout=120)
    assert replay.code == 0, replay.err
