"""The tool-loop drill: SIGKILL a tool-loop writer at every step, prove three things.

    result = run_tool_drill("sqlite:///home/me/drill.db", trials=50, seed=7)
    result.ok, result.to_dict()

Each trial forks a writer (``toolwriter``) that completes the interrupted turn
or starts a new one, and kills it at a step of the loop (the calls stored;
inside the non-idempotent tool, before or after its side effect; a result
stored, before the next call or model request) or at a random moment. After
every kill a fresh open is checked; at the end one writer finishes the turn.
Then:

- **no orphaned call**: no stored call lacks its result (but the last round
  while a turn is interrupted), no result lacks its call, and no request the
  model received carried either;
- **no non-idempotent tool run twice**: the tool appends its call id to a
  file, and no id is there twice; a call whose tool ran is answered
  ``complete`` or ``unknown``, never "not run";
- **every acknowledged message is still there**, and the chain verifies.

The drill's conversation is ``drill-tools-<run id>`` and is deleted at the end.

With ``mcp`` the non-idempotent tool is an MCP server's: ``"builtin"`` (the
drill's own ``record`` server, ``chatstate.drill.mcprecord``) or ``{"server":
ENTRY, "tool": NAME, "arguments": {...}}`` with an ``mcpServers`` entry (stdio).
The server runs behind ``chatstate.drill.mcptee``, which logs every call it
receives, so *duplicates* counts calls that reached the server twice.
"""

from __future__ import annotations

import random
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatstate.core.redact import redact_url
from chatstate.drill._common import reopen
from chatstate.drill.toolserver import ToolWriters
from chatstate.drill.toolwriter import STEPS

if TYPE_CHECKING:
    from chatstate.core.transcript import Conversation

SCHEDULE = (*STEPS, "none", "none", "none")


@dataclass
class ToolDrillResult:
    store: str
    seed: int
    requested: int
    kills: int = 0
    calls: int = 0
    tool_runs: int = 0
    duplicates: int = 0
    orphans: int = 0
    unknown: int = 0
    lost: int = 0
    requests: int = 0
    steps: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    stopped_early: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.problems or self.duplicates or self.orphans or self.lost)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def orphans(messages: list[dict[str, Any]], *, allow_open_tail: bool) -> list[str]:
    """Calls without results and results without calls, in chat-completions order.

    With ``allow_open_tail`` the calls of the last non-tool message may lack results
    (an interrupted round, which recovery completes).
    """
    found: list[str] = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            if m.get("tool_call_id") not in open_calls:
                found.append(f"result without its call at {i} ({m.get('tool_call_id')})")
            open_calls.discard(m.get("tool_call_id"))
            continue
        if open_calls:
            found.append(f"calls without results before {i}: {sorted(open_calls)}")
        open_calls = {c["id"] for c in m.get("tool_calls") or ()}
    if open_calls and not allow_open_tail:
        found.append(f"calls without results at the end: {sorted(open_calls)}")
    return found


def effect_counts(effects: Path) -> Counter[str]:
    if not effects.exists():
        return Counter()
    return Counter(line.split()[0] for line in effects.read_text().splitlines() if line)


def run_tool_drill(url: str, *, trials: int = 50, seed: int | None = None,
                   trial_timeout: float = 20.0, max_seconds: float = 900.0,
                   progress: Callable[[ToolDrillResult], None] | None = None,
                   mcp: str | dict[str, Any] | None = None) -> ToolDrillResult:
    """Run the tool-loop drill against ``url`` (which must already pass the guard).

    No trial starts after ``max_seconds``; the last writer still finishes the turn.
    """
    from chatstate.testing import FakeModel

    seed = seed if seed is not None else random.randrange(1 << 31)
    result = ToolDrillResult(store=redact_url(url), seed=seed, requested=trials)
    cid, scratch = f"drill-tools-{secrets.token_hex(4)}", Path(tempfile.mkdtemp())
    started = time.monotonic()
    try:
        target = _mcp_config(mcp, scratch) if mcp is not None else None
        with FakeModel(chunk_delay=0.001) as fake:
            fake.add_tool_rule(contains="tool turn", rounds=2, text="Let me look. ", calls=[
                {"name": "get_weather", "arguments": {"city": "Oslo"}},
                target[1] if target else {"name": "record", "arguments": {"note": "visited"}}])
            fake.configure(arg_chunk=3)
            writers = ToolWriters(url, fake.base_url, scratch / "effects",
                                  int(trial_timeout) + 30, target[0] if target else None)
            try:
                _trials(writers, url, cid, scratch / "effects", random.Random(seed),
                        trial_timeout, started + max_seconds, result, progress)
            finally:
                writers.close()
            requests = [e["messages"] for e in fake.request_log
                        if e["path"] == "/v1/chat/completions"]
        _final_checks(url, cid, scratch / "effects", requests, result)
    finally:
        _delete(url, cid)
        shutil.rmtree(scratch, ignore_errors=True)
        result.seconds = time.monotonic() - started
    return result


def _mcp_config(mcp: str | dict[str, Any], scratch: Path) -> tuple[Path, dict[str, Any]]:
    """(the writers' MCP.json, the call the model makes): the server behind the tee."""
    import json
    import sys

    if mcp == "builtin":
        mcp = {"server": {"command": sys.executable, "args": [
            "-m", "chatstate.drill.mcprecord", str(scratch / "notes")]},
               "tool": "record", "arguments": {"note": "visited"}}
    assert isinstance(mcp, dict)
    entry = dict(mcp["server"])
    entry["args"] = ["-m", "chatstate.drill.mcptee", str(scratch / "effects"), "--",
                     entry["command"], *entry.get("args", [])]
    entry["command"] = sys.executable
    path = scratch / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"drill": entry}, "tool": mcp["tool"]}))
    return path, {"name": mcp["tool"], "arguments": mcp.get("arguments", {})}


def _trials(writers: ToolWriters, url: str, cid: str, effects: Path, rng: random.Random,
            trial_timeout: float, deadline: float, result: ToolDrillResult,
            progress: Callable[[ToolDrillResult], None] | None) -> None:
    acked: dict[int, str] = {}
    typical = 0.2  # seconds a whole turn takes, as last seen: the random kills' window
    schedule = list(SCHEDULE * (result.requested // len(SCHEDULE) + 1))[:result.requested]
    rng.shuffle(schedule)  # every step gets its share of the kills, in a random order
    steps: Counter[str] = Counter()
    for index, step in enumerate(schedule):
        if time.monotonic() > deadline:
            result.stopped_early = (f"the time cap was reached after {result.kills} of "
                                    f"{result.requested} kills")
            break
        began = time.monotonic()
        pid = writers.go(cid, step, rng.choice(["send", "stream"]))
        if step == "none":
            time.sleep(rng.uniform(0, typical))
            lines = []
        else:
            try:
                lines = writers.until(pid, stop=("at", "end", "error"), timeout=trial_timeout)
            except TimeoutError:
                lines = []
                result.problems.append(f"a writer did not reach {step} in {trial_timeout} s")
        lines += writers.kill(pid)
        result.kills += 1
        ended = any("end" in line for line in lines)
        if ended:
            typical = 0.8 * typical + 0.2 * (time.monotonic() - began)
        at = next((line["at"] for line in lines if "at" in line), None)
        if step != "none" and at != step and "none" in schedule[index + 1:]:
            # that writer's turn had no such step left: a later random kill aims at it
            schedule[schedule.index("none", index + 1)] = step
        steps[at or ("after the turn" if ended else "random")] += 1
        result.problems += [f"writer failed: {line['error']}" for line in lines if "error" in line]
        acked.update({line["ack"]: line["hash"] for line in lines if "ack" in line})
        _check_after_kill(url, cid, effects, acked, result)
        if progress is not None:
            progress(result)
    result.steps = dict(steps)
    pid = writers.go(cid, "none", "send")  # one last writer, left to finish the turn
    lines = writers.until(pid, stop=("end", "error"), timeout=trial_timeout)
    lines += writers.kill(pid)
    result.problems += [f"writer failed: {line['error']}" for line in lines if "error" in line]
    acked.update({line["ack"]: line["hash"] for line in lines if "ack" in line})
    _check_after_kill(url, cid, effects, acked, result)


def _load(url: str, cid: str) -> Conversation:
    from chatstate.core.transcript import Conversation
    from chatstate.errors import ConversationNotFound

    store = reopen(url)
    try:
        return store.load(cid)
    except ConversationNotFound:  # the first writer died before creating it
        return Conversation(id=cid)
    finally:
        store.close()


def _check_after_kill(url: str, cid: str, effects: Path, acked: dict[int, str],
                      result: ToolDrillResult) -> None:
    try:
        conv = _load(url, cid)
    except Exception as exc:  # a corrupt transcript is a finding, not a crash of the drill
        result.problems.append(f"kill {result.kills}: {type(exc).__name__}: {exc}")
        return
    if conv.verify() is not None:
        result.problems.append(f"kill {result.kills}: the chain breaks at {conv.verify()}")
    result.lost = sum(1 for seq, digest in acked.items()
                      if seq >= len(conv.messages) or conv.messages[seq].hash != digest)
    stored = orphans(_sendable(conv), allow_open_tail=True)
    result.problems += [f"kill {result.kills}: {o}" for o in stored]
    result.orphans += len(stored)
    result.duplicates = sum(n - 1 for n in effect_counts(effects).values() if n > 1)


def _final_checks(url: str, cid: str, effects: Path, requests: list[Any],
                  result: ToolDrillResult) -> None:
    conv = _load(url, cid)
    stored = orphans(_sendable(conv), allow_open_tail=False)
    sent = [o for r in requests for o in orphans(r, allow_open_tail=False)]
    result.problems += [f"at the end: {o}" for o in stored] + [f"sent: {o}" for o in sent]
    result.orphans += len(stored) + len(sent)
    result.requests = len(requests)
    ran = effect_counts(effects)
    answers = {m.tool_call_id: m for m in conv.messages
               if m.role == "tool" and m.status != "partial"}
    calls = [c for m in conv.messages for c in m.tool_calls or ()]
    result.calls, result.tool_runs = len(calls), sum(ran.values())
    result.unknown = sum(1 for m in answers.values() if m.status == "unknown")
    for call_id in ran:
        answer = answers.get(call_id)
        if answer is None or answer.status not in ("complete", "unknown"):
            result.problems.append(f"call {call_id} ran but is answered "
                                   f"{answer.status if answer else 'nothing'}")
    if not conv.messages or conv.messages[-1].role != "assistant" or conv.partial is not None:
        result.problems.append("the last writer did not finish the turn")


def _sendable(conv: Any) -> list[dict[str, Any]]:
    """The transcript as a model would be sent it: "started" markers are not sent."""
    return [m.to_openai() for m in conv.messages if m.status != "partial"]


def _delete(url: str, cid: str) -> None:
    from chatstate.errors import ChatstateError

    try:
        store = reopen(url)
        try:
            store.delete(cid)
        finally:
            store.close()
    except (ChatstateError, KeyError):
        pass  # never created, or the store is gone: nothing of ours is left to remove
