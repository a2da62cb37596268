"""A tool-loop writer in a child process, for tests/test_toolloop_crash.py to SIGKILL.

    tool_child.py URL BASE_URL EFFECTS

A fork server like stream_child.py: it imports and warms up once, prints
``"ready"``, then for each ``go CID STEP MODE`` line forks one writer and prints
``{"pid": PID}``; once that writer is reaped it prints ``{"reaped": PID}``.

The writer opens the conversation (``{"found": ...}``: does the chain verify,
which calls are pending), then completes the interrupted turn with
``retry(tools=...)`` or sends a new one, with two tools: ``get_weather``
(idempotent) and ``record`` (not idempotent: it appends its call id to EFFECTS,
fsync'd, so the test can count how often each call really ran). Every message
the loop stores is printed as ``{"ack": SEQ, "hash": H}`` after it is stored.

STEP names where the writer stops and waits to be killed (printing ``{"at": STEP}``):
``call-stored`` (the assistant's calls are stored), ``tool-before`` (inside
``record``, its marker stored, before the side effect), ``tool-after`` (the
side effect is done, the result not stored), ``result-stored`` (a result is
stored, the next call or the next model request not yet made), or ``none``
(the test kills at a random moment instead). MODE ``stream`` streams the turn.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from chatstate import Chat, Message, make_adapter, open_store, tool
from chatstate.toolloop import pending_calls
from chatstate.tools import current_call_id

STEP = "none"
EFFECTS = ""


def say(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def pause(step: str) -> None:
    if step == STEP:
        say({"at": step})
        time.sleep(60)


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@tool(idempotent=False)
def record(note: str) -> str:
    """Write a note down (a side effect: never run twice)."""
    pause("tool-before")
    fd = os.open(EFFECTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{current_call_id()} {note}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    pause("tool-after")
    return "recorded"


def on_tool(msg: Message) -> None:
    say({"ack": msg.seq, "hash": msg.hash})
    if msg.role == "assistant":
        pause("call-stored")
    else:
        pause("result-stored")


def writer(url: str, adapter: Any, cid: str, mode: str) -> None:
    store = open_store(url)
    chat = Chat(store, conversation_id=cid, adapter=adapter, on_tool=on_tool)
    turn = chat.interrupted
    say({"found": {"verify": chat.conversation.verify(),
                   "pending": [c.id for c in pending_calls(chat.conversation)]}})
    tools = [get_weather, record]
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


def serve(url: str, base_url: str) -> None:
    def adapter() -> Any:
        return make_adapter(base_url=base_url, api_key="child-key", model="fake-model",
                            max_retries=0)

    warm = adapter()
    warm.complete([{"role": "user", "content": "warm up"}])  # load every lazy import
    warm.close()
    unused = adapter()  # built once; each forked writer gets a copy with an empty pool
    say("ready")
    global STEP
    for line in sys.stdin:
        command, cid, step, mode = [*line.split(), "", "", "", ""][:4]
        if command != "go":
            break
        STEP = step
        pid = os.fork()
        if pid == 0:
            try:
                writer(url, unused, cid, mode)
            except Exception as exc:
                say({"error": repr(exc)})
            time.sleep(60)  # idle until killed, so the pid cannot be reused before the kill
            os._exit(0)
        say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        say({"reaped": pid, "status": status})


if __name__ == "__main__":
    EFFECTS = sys.argv[3]
    serve(sys.argv[1], sys.argv[2])
