"""A streaming chat in a child process, for tests/session/test_session_crash.py to SIGKILL.

    stream_child.py URL BASE_URL

Importing chatstate costs about a second, and the crash test kills a writer
dozens of times; so this process imports and warms up once, prints
``"ready"``, then acts as a fork server. Each ``go CID MODE`` line on stdin
forks one writer (a real process, with its own store handle and HTTP client)
and prints ``{"pid": PID}``; the test SIGKILLs that pid at a random moment,
then this process reaps it and prints ``{"reaped": PID}``, so everything the
writer printed is in the pipe before that line. The writer:

    {"found": {...}}     what a fresh open of the conversation shows, before
                         anything is written: the latest reply text per turn,
                         the interrupted turn, and whether the chain verifies
    {"turn": TURN_ID}    the turn it is streaming (MODE "retry" completes the
                         interrupted turn if there is one, else a new message)
    {"d": DELTA}         printed only after Chat yielded it, i.e. once stored
    {"end": true}        the reply is complete; it then idles until killed
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from chatstate import Chat, Conversation, make_adapter, open_store


def say(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def latest_replies(conv: Conversation) -> dict[str, str]:
    """The newest assistant text stored for each turn (the partial slot counts as newest)."""
    replies = {m.turn_id: m.content for m in conv.messages if m.role == "assistant"}
    if conv.partial is not None:
        replies[conv.partial.turn_id] = conv.partial.content
    return replies


def writer(url: str, adapter: Any, cid: str, mode: str) -> None:
    store = open_store(url)
    chat = Chat(store, conversation_id=cid, adapter=adapter)
    turn = chat.interrupted
    say({"found": {"replies": latest_replies(chat.conversation),
                   "verify": chat.conversation.verify(),
                   "interrupted": turn.turn_id if turn else None}})
    if turn is not None and mode == "retry":
        deltas = chat.retry_stream()
        turn_id = turn.turn_id
    else:
        deltas = chat.stream(f"message {len(chat.messages)} from pid {os.getpid()}")
        turn_id = chat.messages[-1].turn_id
    say({"turn": turn_id})
    for delta in deltas:
        say({"d": delta})
    say({"end": True})


def serve(url: str, base_url: str) -> None:
    def adapter() -> Any:
        return make_adapter(base_url=base_url, api_key="child-key", model="fake-model",
                            max_retries=0)

    warm = adapter()
    warm.complete([{"role": "user", "content": "warm up"}])  # load every lazy import
    warm.close()
    # Built once, never used here: each forked writer gets a copy with an empty pool.
    unused = adapter()
    say("ready")
    for line in sys.stdin:
        command, cid, mode = [*line.split(), "", "", ""][:3]
        if command != "go":
            break
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
    serve(sys.argv[1], sys.argv[2])
