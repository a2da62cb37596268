"""How a stored conversation ends: an interrupted turn, a reply cut short, or neither.

Read from the conversation alone (no model, no lease), so `Chat`, `list --check` and any
other reader tell the same story about the same transcript.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatstate.core.transcript import Conversation, Message
from chatstate.session import tool_loop as toolloop
from chatstate.session.sendable import CUT_REASONS
from chatstate.session.tool_loop import PendingCall


@dataclass(frozen=True)
class Interrupted:
    """A turn that a killed process, a model failure or Ctrl-C left without a complete reply."""

    turn_id: str
    user_message: Message | None
    partial: Message | None  # the stored in-progress reply, if any
    pending_calls: tuple[PendingCall, ...] = ()  # tool calls still without a result

    def describe(self) -> str:
        if self.pending_calls:
            names = ", ".join(f"{c.name} ({c.id}{', started' if c.started else ''})"
                              for c in self.pending_calls)
            return f"turn {self.turn_id} has tool calls without results: {names}"
        if self.partial is not None:
            return (f"the reply to turn {self.turn_id} was cut off after "
                    f"{len(self.partial.text)} characters (kept as partial)")
        return f"turn {self.turn_id} has no reply yet"


def interrupted_turn(conv: Conversation) -> Interrupted | None:
    """The turn left without a complete reply, if the conversation ends in one."""
    last = conv.last
    asking = toolloop.calls_message(conv)
    if asking is not None:  # tool calls without results, or results without a reply
        return Interrupted(asking.turn_id, user_of(conv, asking.turn_id), conv.partial,
                           tuple(toolloop.pending_calls(conv)))
    if conv.partial is not None:
        return Interrupted(conv.partial.turn_id, user_of(conv, conv.partial.turn_id),
                           conv.partial)
    if last is not None and last.role == "user":
        return Interrupted(last.turn_id, last, None)
    if last is not None and last.role == "assistant" and last.status == "partial":
        return Interrupted(last.turn_id, user_of(conv, last.turn_id), None)
    return None


def cut_short_reply(conv: Conversation) -> Message | None:
    """The last reply, if the model stopped it early (token limit, content filter)."""
    last = conv.last
    if (conv.partial is None and last is not None and last.role == "assistant"
            and last.finish_reason in CUT_REASONS):
        return last
    return None


def user_of(conv: Conversation, turn_id: str) -> Message | None:
    for msg in reversed(conv.messages):
        if msg.turn_id == turn_id and msg.role == "user":
            return msg
    return None


def unanswered_start(conv: Conversation) -> bool:
    """The conversation holds nothing but its first question (and a system prompt), with no
    reply, partial or tool call: what a failed first attempt leaves behind."""
    return (conv.partial is None and bool(conv.messages)
            and all(m.role in ("system", "user") for m in conv.messages)
            and sum(m.role == "user" for m in conv.messages) == 1)
