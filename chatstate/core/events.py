"""Events: how the append-only chain says "this is no longer shown".

A framework's ``pop_item`` or ``clear_session`` (and, later, a summary standing in
for older turns) must not rewrite acknowledged messages. It appends a message of
role ``event`` whose ``extra["event"]`` says what it hides: ``{"op": "pop", "seq": N}``
hides message N, ``{"op": "clear"}`` hides everything before it. What is shown is
computed from the chain; the hidden messages stay in it, hash-covered, for replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chatstate.core.transcript import Message

EVENT = "event"
"""``extra[EVENT]`` of an event message: what it hides."""


def event_message(prev: Message | None, op: str, turn_id: str,
                  seq: int | None = None) -> Message:
    """Seal the event after ``prev``: ``pop`` (of message ``seq``) or ``clear``."""
    body: dict[str, Any] = {"op": op} if seq is None else {"op": op, "seq": seq}
    text = f"{op} item seq {seq}" if seq is not None else f"{op}: every earlier item hidden"
    return Message.seal(prev, role="event", content=text, turn_id=turn_id,
                        extra={EVENT: body})


def shown(messages: Sequence[Message]) -> list[Message]:
    """The messages the chain shows now: in order, minus events and what they hid."""
    out: dict[int, Message] = {}
    for msg in messages:
        if msg.role != "event":
            out[msg.seq] = msg
            continue
        op = (msg.extra or {}).get(EVENT)
        if not isinstance(op, dict):
            continue
        if op.get("op") == "clear":
            out.clear()
        elif op.get("op") == "pop":
            out.pop(op.get("seq", -1), None)
    return list(out.values())
