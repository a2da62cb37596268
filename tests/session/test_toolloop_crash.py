"""SIGKILL the tool loop at every step: no orphaned call, no tool run twice, no ack lost.

The drill's tool writer (``chatstate.drill.toolwriter``, a fork server) forks
one writer per round. Each writer opens the
conversation (recovery), completes the interrupted turn with
``retry(tools=...)`` or starts a new one, and is SIGKILLed: at a named step
(the calls stored; inside the non-idempotent tool before and after its side
effect; a result stored, before the next call or model request), or at a
random moment, which lands inside store writes and model requests too.

After every kill a fresh load must verify, hold every message a writer
acknowledged, and have no call left without its result except in the last,
interrupted, round. The side-effect file must name no call twice. At the end a
writer finishes cleanly, and then: every call has its result; every call
whose tool ran is answered ``complete`` or ``unknown`` (never "not run");
and no request the fake model received had a call without its result or a
result without its call.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.stores import fresh_load

from chatstate import Conversation
from chatstate.drill.tooldrill import orphans
from chatstate.drill.toolserver import ToolWriters
from chatstate.testing import FakeModel

KILLS = 50
STEPS = ["call-stored", "tool-before", "tool-after", "result-stored", "none", "none", "none"]
CID = "crash-tools"

pytestmark = pytest.mark.slow


def stored_dicts(conv: Conversation) -> list[dict[str, Any]]:
    """The transcript as a model would be sent it: "started" markers are not sent."""
    return [m.to_openai() for m in conv.messages if m.status != "partial"]


def effect_counts(effects: Path) -> Counter[str]:
    if not effects.exists():
        return Counter()
    return Counter(line.split()[0] for line in effects.read_text().splitlines() if line)


def run_crash_loop(url: str, tmp_path: Path, kills: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    effects = tmp_path / "effects.log"
    steps: Counter[str] = Counter()
    with FakeModel(chunk_delay=0.001) as fake:
        fake.add_tool_rule(contains="tool turn", rounds=2, text="Let me look. ", calls=[
            {"name": "get_weather", "arguments": {"city": "Oslo"}},
            {"name": "record", "arguments": {"note": "visited"}}])
        fake.configure(arg_chunk=3)
        server = ToolWriters(url, fake.base_url, effects, writer_timeout=60)
        acked: dict[int, str] = {}
        typical = 0.2
        try:
            schedule = (STEPS * (kills // len(STEPS) + 1))[:kills]
            rng.shuffle(schedule)  # every step gets its share of kills, in a random order
            for index, step in enumerate(schedule):
                mode = rng.choice(["send", "stream"])
                started = time.monotonic()
                pid = server.go(CID, step, mode)
                if step == "none":
                    time.sleep(rng.uniform(0, typical))
                    lines = server.early
                    server.early = []
                else:
                    lines = server.until(pid, stop=("at", "end", "error"))
                lines += server.kill(pid)
                errors = [line["error"] for line in lines if "error" in line]
                assert not errors, f"the writer failed before it was killed: {errors}"
                if any("end" in line for line in lines):
                    typical = 0.8 * typical + 0.2 * (time.monotonic() - started)
                at = next((line["at"] for line in lines if "at" in line), None)
                if step != "none" and at != step and "none" in schedule[index + 1:]:
                    # this writer never got to that step (its turn had no such step left):
                    # a later random kill aims at it instead
                    schedule[schedule.index("none", index + 1)] = step
                steps[at or ("after the turn" if any("end" in line for line in lines)
                             else "random")] += 1
                acked.update({line["ack"]: line["hash"] for line in lines if "ack" in line})
                found = next((line["found"] for line in lines if "found" in line), None)
                assert found is None or found["verify"] is None
                conv = fresh_load(url, CID)
                assert conv.verify() is None
                for seq, digest in acked.items():
                    assert conv.messages[seq].hash == digest, f"acknowledged seq {seq} is gone"
                assert orphans(stored_dicts(conv), allow_open_tail=True) == []
                dup = {c: n for c, n in effect_counts(effects).items() if n > 1}
                assert not dup, f"a non-idempotent tool ran twice: {dup}"

            # One last writer, left to finish: everything is answered.
            pid = server.go(CID, "none", "send")
            lines = server.until(pid, stop=("end", "error"))
            lines += server.kill(pid)
            assert not [line for line in lines if "error" in line], lines
        finally:
            server.close()
        requests = [e["messages"] for e in fake.request_log
                    if e["path"] == "/v1/chat/completions" and e["messages"][-1:] != [
                        {"role": "user", "content": "warm up"}]]
    conv = fresh_load(url, CID)
    assert conv.verify() is None
    assert conv.partial is None
    assert orphans(stored_dicts(conv), allow_open_tail=False) == []
    bad_requests = [o for r in requests for o in orphans(r, allow_open_tail=False)]
    assert bad_requests == [], bad_requests
    ran = effect_counts(effects)
    results = {m.tool_call_id: m for m in conv.messages
               if m.role == "tool" and m.status != "partial"}
    calls = [c for m in conv.messages for c in m.tool_calls or ()]
    for call_id in ran:
        assert results[call_id].status in ("complete", "unknown"), results[call_id]
    for call in calls:
        if call["function"]["name"] == "record" and results[call["id"]].status == "complete":
            assert ran[call["id"]] == 1
    figures = {"kills": kills, "calls": len(calls), "tool_runs": sum(ran.values()),
               "duplicates": sum(n - 1 for n in ran.values() if n > 1),
               "unknown": sum(1 for r in results.values() if r.status == "unknown"),
               "orphans": len(bad_requests), "requests": len(requests),
               "steps": dict(steps)}
    print(f"{url.split(':')[0]}: {figures}")
    return figures


@pytest.mark.invariant(4, 7)
@pytest.mark.parametrize("kind", ["json", "sqlite", "s3"])
def test_sigkill_at_every_step_of_the_tool_loop(kind: str, tmp_path: Path,
                                                request: pytest.FixtureRequest) -> None:
    from conftest import url_for

    url = url_for(kind, tmp_path, request)
    figures = run_crash_loop(url, tmp_path, KILLS, seed={"json": 1, "sqlite": 2, "s3": 3}[kind])
    for step in ("call-stored", "tool-before", "tool-after", "result-stored", "random"):
        assert figures["steps"].get(step, 0) >= 3, figures  # every step was really hit
    assert figures["unknown"] >= 1, "no kill left a non-idempotent call half-run"
    assert figures["duplicates"] == 0
    assert figures["orphans"] == 0
