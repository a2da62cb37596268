"""The proxy's writes, in the session's order: the request's messages, the reply, nothing else.

These are blocking store calls; the app runs each in a worker thread. One
``Turn`` is one proxied request: its new messages are durable before the request
goes upstream, each streamed piece is saved as the partial reply before it is
relayed, and the reply is committed into the chain before its last chunk is.

Like ``Chat``, a turn holds the conversation's writer lease from before its first
write until it ends (``Turn.held``, renewed meanwhile), so a second writer (a REPL,
a script, another proxy behind the same load balancer) cannot cut its live stream:
it waits or is told who holds the conversation.

Every write goes through the session's turn writer (``Turn.writer``, a
``TurnWriter``), which orders them and fences each with the lease: this module
only decides what the request's new messages are.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatstate.core.transcript import Conversation, Message, new_id, new_turn_id
from chatstate.errors import ConflictError, ConversationInUse, ConversationNotFound, LeaseLost
from chatstate.serve._history import HistoryIndex, Plan, message_fields, reconcile, visible
from chatstate.session.turn_writer import TurnWriter
from chatstate.stores.base import LEASE_TERM, Store

log = logging.getLogger("chatstate.serve")

SEAL_FIELDS = ("role", "content", "created_at", "turn_id", "status", "model", "usage", "params",
               "tool_calls", "tool_call_id", "name", "extra")


@dataclass
class Turn:
    writer: TurnWriter  # every write of the turn, fenced by its lease until ``end``
    turn_id: str
    forked_from: dict[str, Any] | None = None

    @property
    def conversation(self) -> Conversation:
        return self.writer.conversation

    @property
    def id(self) -> str:
        return self.writer.id


class Writer:
    """Turns proxied requests into appends on one store."""

    def __init__(self, store: Store, index: HistoryIndex, *, lease_wait: float = 0.0,
                 lease_term: float = LEASE_TERM) -> None:
        self.store = store
        self.index = index
        self.lease_wait, self.lease_term = lease_wait, lease_term

    def _load(self, conversation_id: str | None) -> Conversation | None:
        if conversation_id is None:
            return None
        try:
            conv: Conversation = self.store.load(conversation_id)
        except ConversationNotFound:
            return None
        return conv

    def begin(self, conversation_id: str | None, incoming: Sequence[Mapping[str, Any]]) -> Turn:
        """Make the request's new messages durable; returns the turn to answer, holding
        the lease of the conversation it writes (``end`` gives it up).

        ConversationInUse if another live writer holds it for longer than ``lease_wait``.
        """
        for attempt in (1, 2):
            cid = conversation_id or self.index.find(incoming)
            conv = self._load(cid)
            plan = reconcile(conv, cid or new_id("p"), new_id("p"), incoming)
            writer = self._writer_for(plan, incoming)
            held = writer.hold()
            try:
                turn = self._write(writer, plan)
            except BaseException as exc:
                writer.release(held)
                if attempt == 2 or not isinstance(exc, ConflictError) \
                        or isinstance(exc, ConversationInUse | LeaseLost):
                    raise  # another writer keeps moving this conversation on
                continue  # it moved between our load and our lease: plan again
            return turn
        raise AssertionError("unreachable")

    def _writer_for(self, plan: Plan, incoming: Sequence[Mapping[str, Any]]) -> TurnWriter:
        """The turn writer of the conversation the plan writes (new ones are created by
        ``_write``), with a fresh owner token: two turns of this process never share a
        lease."""
        if plan.fork_of is not None:
            source = plan.fork_of
            kept = visible(source)[:plan.common]
            at = kept[-1] if kept else None
            forked_from = {"id": source.id, "seq": at.seq if at else -1,
                           "hash": at.hash if at else None}
            # the title is the history's first user message (the index's lookup key)
            title = source.title if any(m.role == "user" for m in kept) else title_of(incoming)
            conv = Conversation(id=plan.conversation_id, title=title,
                                metadata={"via": "serve", "forked_from": forked_from})
        elif plan.stored is None:
            conv = Conversation(id=plan.conversation_id, title=title_of(incoming),
                                metadata={"via": "serve"})
        else:
            conv = plan.stored
        return TurnWriter(self.store, conv, created=plan.stored is not None
                          and plan.fork_of is None, owner=secrets.token_hex(8),
                          lease_term=self.lease_term, lease_wait=self.lease_wait)

    def end(self, turn: Turn) -> None:
        """The turn is over: give its lease up (it lapses by itself if this fails)."""
        turn.writer.release()

    def _write(self, writer: TurnWriter, plan: Plan) -> Turn:
        forked_from = None
        if plan.fork_of is not None:
            forked_from = self._fork(writer, plan)
        elif not writer.created:
            if not writer.create():
                raise ConflictError(f"conversation {writer.id!r} was created meanwhile by "
                                    "another writer")
        elif writer.conversation.partial is not None:
            # a cut-off reply is kept in the chain, as partial
            writer.append([writer.conversation.partial])
        conv = writer.conversation
        # The same request again (nothing new) answers the unanswered turn, under its id.
        turn_id = conv.messages[-1].turn_id if not plan.new and conv.messages else new_turn_id()
        turn = Turn(writer, turn_id, forked_from)
        if plan.new:
            sealed: list[Message] = []
            for raw in plan.new:
                prev = sealed[-1] if sealed else conv.last
                sealed.append(Message.seal(prev, turn_id=turn.turn_id, **message_fields(raw)))
            writer.append(sealed)
        return turn

    def _fork(self, writer: TurnWriter, plan: Plan) -> dict[str, Any]:
        source = plan.fork_of
        assert source is not None
        kept = visible(source)[:plan.common]
        forked_from: dict[str, Any] = writer.conversation.metadata["forked_from"]
        if not writer.create():
            raise ConflictError(f"conversation {writer.id!r} was created meanwhile by "
                                "another writer")
        copies: list[Message] = []
        for m in kept:
            fields = {k: getattr(m, k) for k in SEAL_FIELDS}
            copies.append(Message.seal(copies[-1] if copies else None, **fields))
        writer.append(copies)
        log.info("serve: %s diverged from %s at seq %s; continuing in fork %s",
                 source.id, source.id, forked_from["seq"], writer.id)
        return forked_from

    def save_partial(self, turn: Turn, text: str, model: str | None) -> None:
        turn.writer.save_partial(turn.turn_id, text, model)

    def commit(self, turn: Turn, reply: Mapping[str, Any]) -> Message:
        """Append the complete reply (``Message.seal`` keywords) and index the new history."""
        message = turn.writer.reply(turn.turn_id, **reply)
        self.index.add(turn.conversation)
        return message

    def note_failure(self, turn: Turn, status: int, detail: str) -> None:
        """Say in the transcript why the turn has no reply (an upstream error)."""
        turn.writer.note_upstream_error(turn.turn_id, status, detail)


def title_of(incoming: Sequence[Mapping[str, Any]]) -> str:
    """A new conversation's title: its first user message, as far as it is text."""
    for message in incoming:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str):
            return " ".join(content.split())[:60]
    return ""
