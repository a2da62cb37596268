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

import pytest
from support.agents_serve import AGENTS_SCRIPT
from support.cli_helpers import cli_env, run_cli
from support.serve_helpers import ServeProcess, serve_env
from test_serve_dialects import conversations

from chatstate.testing import FakeModel

pytestmark = pytest.mark.slow

TOKEN = "tok-agents-kill-0123456789abcdef01234567"
EXPECTED = ["system", "user", "assistant", "tool", "assistant", "user", "assistant"]


def _agent(base_url: str, mode: str, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", AGENTS_SCRIPT, base_url, TOKEN, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=serve_env(tmp_path))


def _in_flight(fake: FakeModel, url: str, mode: str) -> bool:
    """The request carrying the tool's output is upstream (and, streamed, half-relayed)."""
    if mode == "run":
        return len(fake.request_log) >= 2
    return any(c.partial is not None and c.partial.text and
               any(m.role == "tool" for m in c.messages) for c in conversations(url))


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
    convs = conversations(url)
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
