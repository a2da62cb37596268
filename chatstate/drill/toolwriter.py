"""The tool-loop drill's writer: a fork server whose children run tool turns until killed.

    python -m chatstate.drill.toolwriter URL BASE_URL EFFECTS TIMEOUT [MCP.json]

It imports and warms up once, prints ``"ready"``, then for each ``go CID STEP
MODE`` line on stdin forks one writer and prints ``{"pid": PID}``; once that
writer is reaped it prints ``{"reaped": PID}``, after everything the writer said.

A writer opens the conversation (recovery; it prints ``{"found": {"verify",
"pending"}}``), completes the interrupted turn with ``retry(tools=...)`` or
sends a new message, with two tools: ``get_weather`` (idempotent) and
``record`` (not idempotent: it appends its call id to EFFECTS and fsyncs, so
the drill can count how often each call really ran). Every message the loop
stores is printed as ``{"ack": SEQ, "hash": H}`` once stored; ``{"end": true}``
ends the turn. MODE ``stream`` streams the turn, ``send`` does not.

STEP is where the writer stops and waits for its SIGKILL, printing ``{"at":
STEP}``: ``call-stored`` (the assistant's calls are stored), ``tool-before``
(inside ``record``, its started marker stored, before the side effect),
``tool-after`` (the side effect done, its result not stored),
``result-stored`` (a result stored; the next call or model request not yet
made); ``none`` lets the runner kill at a random moment instead. A writer
never outlives TIMEOUT seconds (SIGALRM).

With MCP.json (``{"mcpServers": {...}, "tool": NAME}``) the non-idempotent tool
is NAME of those MCP servers instead of ``record`` (the drill counts the calls
the server received, through ``chatstate.drill.mcptee``); ``tool-before`` is
then the marker stored, the request not sent, and ``tool-after`` the server's
answer received, its result not stored. Each writer starts its own servers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from chatstate.core.tools import current_call_id, tool
from chatstate.core.transcript import Message
from chatstate.drill._common import reopen
from chatstate.drill.writer import make_adapter
from chatstate.session.chat import Chat
from chatstate.session.tool_loop import pending_calls

STEPS = ("call-stored", "tool-before", "tool-after", "result-stored")
_state = {"step": "none", "effects": "", "mcp": ""}


def say(obj: object) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())  # one write: whole or absent


def pause(step: str) -> None:
    if step == _state["step"]:
        say({"at": step})
        while True:
            time.sleep(3600)  # until the SIGKILL


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@tool(idempotent=False)
def record(note: str) -> str:
    """Write a note down (a side effect: must never run twice)."""
    pause("tool-before")
    fd = os.open(_state["effects"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{current_call_id()} {note}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    pause("tool-after")
    return "recorded"


def on_tool(msg: Message) -> None:
    say({"ack": msg.seq, "hash": msg.hash})
    pause("call-stored" if msg.role == "assistant" else "result-stored")


def write(url: str, adapter: Any, cid: str, mode: str) -> None:
    chat = Chat(reopen(url), conversation_id=cid, adapter=adapter, on_tool=on_tool)
    turn = chat.interrupted
    say({"found": {"verify": chat.conversation.verify(),
                   "pending": [c.id for c in pending_calls(chat.conversation)]}})
    tools = [get_weather, *_mcp_tools()] if _state["mcp"] else [get_weather, record]
    if turn is not None:
        deltas = chat.retry_stream(tools=tools) if mode == "stream" else None
        if deltas is None:
            chat.retry(tools=tools)
    else:
        text = f"tool turn {len(chat.messages)} from pid {os.getpid()}"
        deltas = chat.stream(text, tools=tools) if mode == "stream" else None
        if deltas is None:
            chat.send(text, tools=tools)
    for _ in deltas or ():
        pass
    final = chat.messages[-1]
    say({"ack": final.seq, "hash": final.hash})
    say({"end": True})


def _mcp_tools() -> list[Any]:
    """The MCP servers' tools, the drill's target paused around its call like ``record``."""
    from chatstate.tools_mcp import mcp_tools

    with open(_state["mcp"], encoding="utf-8") as f:
        config = json.load(f)
    tools = list(mcp_tools({"mcpServers": config["mcpServers"]}))
    for t in tools:
        if t.name == config["tool"]:
            t.fn = _paused(t.fn)
    return tools


def _paused(fn: Any) -> Any:
    def run(**arguments: Any) -> Any:
        pause("tool-before")
        out = fn(**arguments)
        pause("tool-after")
        return out
    return run


def serve(url: str, base_url: str, effects: str, timeout: int, mcp: str = "") -> None:
    _state["effects"], _state["mcp"] = effects, mcp
    warm = make_adapter(base_url)
    warm.complete([{"role": "user", "content": "warm up"}])  # load every lazy import
    warm.close()
    adapter = make_adapter(base_url)  # each forked writer gets a copy with an empty pool
    say("ready")
    for line in sys.stdin:
        command, cid, step, mode = [*line.split(), "", "", "", ""][:4]
        if command != "go":
            break
        _state["step"] = step
        pid = os.fork()
        if pid == 0:
            _child(url, adapter, cid, mode, timeout)
        say({"pid": pid})
        os.waitpid(pid, 0)
        say({"reaped": pid})


def _child(url: str, adapter: Any, cid: str, mode: str, timeout: int) -> None:
    signal.alarm(timeout)  # a writer outlives no drill
    try:
        write(url, adapter, cid, mode)
    except BaseException as exc:  # nothing may escape a fork
        say({"error": f"{type(exc).__name__}: {exc}"[:2000]})
    try:
        while True:  # wait for the SIGKILL, so the pid cannot be reused before it lands
            time.sleep(3600)
    finally:
        os._exit(1)


def main(argv: Sequence[str]) -> None:
    url, base_url, effects, timeout, *mcp = argv
    serve(url, base_url, effects, int(timeout), *mcp)


if __name__ == "__main__":
    main(sys.argv[1:])
