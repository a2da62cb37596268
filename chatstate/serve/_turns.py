"""The proxy's writes, in the session's order: the request's messages, the reply, nothing else.

These are blocking store calls; the app runs each in a worker thread. One
``Turn`` is one proxied request: its new messages are durable before the request
goes upstream, each streamed piece is saved as the partial reply before it is
relayed, and the reply is committed into the chain before its last chunk is.

Like ``Chat``, a turn holds the conversation's writer lease from before its first
write until it ends (``Turn.held``, renewed meanwhile), so a second writer (a REPL,
a script, another proxy behind the same load balancer) cannot cut its live stream:
it waits or is told who holds the conversation.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chatstate.core.transcript import Conversation, Message, new_id, new_turn_id, now_iso
from chatstate.errors import ConflictError, ConversationInUse, ConversationNotFound
from chatstate.serve._history import HistoryIndex, Plan, message_fields, reconcile, visible
from chatstate.session.writer_lease import Held, hold
from chatstate.stores.base import LEASE_TERM

log = logging.getLogger("chatstate.serve")

SEAL_FIELDS = ("role", "content", "created_at", "turn_id", "status", "model", "usage", "params",
               "tool_calls", "tool_call_id", "name", "extra")


@dataclass
class Turn:
    conversation: Conversation
    turn_id: str
    forked_from: dict[str, Any] | None = None
    held: Held | None = None  # the writer lease, until ``end``

    @property
    def id(self) -> str:
        return self.conversation.id


class Writer:
    """Turns proxied requests into appends on one store."""

    def __init__(self, store: Any, index: HistoryIndex, *, lease_wait: float = 0.0,
                 lease_term: float = LEASE_TERM) -> None:
        self.store = store
        self.index = index
        self.lease_wait, self.lease_term = lease_wait, lease_term

    def build_index(self) -> int:
        """Index every stored conversation's history (at startup). Returns how many."""
        count = 0
        for summary in self.store.list_conversations():
            try:
                self.index.add(self.store.load(summary.id))
                count += 1
            except Exception as exc:  # a damaged transcript is reported, never indexed over
                log.warning("serve: not indexing %s: %s", summary.id, exc)
        return count

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
            # a fresh owner token per turn: two turns of this process never share a lease
            held = hold(self.store, plan.conversation_id, secrets.token_hex(8),
                        term=self.lease_term, wait=self.lease_wait)
            try:
                turn = self._write(plan, incoming)
            except BaseException as exc:
                held.release()
                if attempt == 2 or not isinstance(exc, ConflictError) \
                        or isinstance(exc, ConversationInUse):
                    raise  # another writer keeps moving this conversation on
                continue  # it moved between our load and our lease: plan again
            turn.held = held
            return turn
        raise AssertionError("unreachable")

    def end(self, turn: Turn) -> None:
        """The turn is over: give its lease up (it lapses by itself if this fails)."""
        held, turn.held = turn.held, None
        if held is not None:
            held.release()

    def _write(self, plan: Plan, incoming: Sequence[Mapping[str, Any]]) -> Turn:
        forked_from = None
        loaded = plan.stored
        if plan.fork_of is not None:
            conv, forked_from = self._fork(plan)
        elif loaded is None:
            conv = Conversation(id=plan.conversation_id, title=_title(incoming),
                                metadata={"via": "serve"})
            self.store.create(conv)
        else:
            conv = loaded
            if conv.partial is not None:  # a cut-off reply is kept in the chain, as partial
                self._append(conv, [conv.partial])
        # The same request again (nothing new) answers the unanswered turn, under its id.
        turn_id = conv.messages[-1].turn_id if not plan.new and conv.messages else new_turn_id()
        turn = Turn(conv, turn_id, forked_from)
        if plan.new:
            sealed: list[Message] = []
            for raw in plan.new:
                prev = sealed[-1] if sealed else conv.last
                sealed.append(Message.seal(prev, turn_id=turn.turn_id, **message_fields(raw)))
            self._append(conv, sealed)
        return turn

    def _fork(self, plan: Plan) -> tuple[Conversation, dict[str, Any]]:
        source = plan.fork_of
        assert source is not None
        kept = visible(source)[:plan.common]
        at = kept[-1] if kept else None
        forked_from = {"id": source.id, "seq": at.seq if at else -1,
                       "hash": at.hash if at else None}
        conv = Conversation(id=plan.conversation_id, title=source.title,
                            metadata={"via": "serve", "forked_from": forked_from})
        self.store.create(conv)
        copies: list[Message] = []
        for m in kept:
            fields = {k: getattr(m, k) for k in SEAL_FIELDS}
            copies.append(Message.seal(copies[-1] if copies else None, **fields))
        if copies:
            self._append(conv, copies)
        log.info("serve: %s diverged from %s at seq %s; continuing in fork %s",
                 source.id, source.id, forked_from["seq"], conv.id)
        return conv, forked_from

    def _append(self, conv: Conversation, messages: list[Message]) -> None:
        self.store.append(conv.id, messages)
        conv.messages = conv.messages + messages
        if conv.partial is not None and conv.partial.seq <= messages[-1].seq:
            conv.partial = None

    def save_partial(self, turn: Turn, text: str, model: str | None) -> None:
        partial = Message.seal(turn.conversation.last, role="assistant", content=text,
                               turn_id=turn.turn_id, status="partial", model=model)
        self.store.save_partial(turn.id, partial)
        turn.conversation.partial = partial

    def commit(self, turn: Turn, reply: Mapping[str, Any]) -> Message:
        """Append the complete reply (``Message.seal`` keywords) and index the new history."""
        message = Message.seal(turn.conversation.last, role="assistant", turn_id=turn.turn_id,
                               **reply)
        self._append(turn.conversation, [message])
        self.index.add(turn.conversation)
        return message

    def note_failure(self, turn: Turn, status: int, detail: str) -> None:
        """Say in the transcript why the turn has no reply (an upstream error)."""
        meta = dict(turn.conversation.metadata)
        meta["last_upstream_error"] = {"status": status, "detail": detail[:500],
                                       "turn_id": turn.turn_id, "at": now_iso()}
        try:
            self.store.set_header(turn.id, metadata=meta)
            turn.conversation.metadata = meta
        except Exception as exc:  # the reply is already lost upstream; do not mask that
            log.warning("serve: %s: could not record the upstream error: %s", turn.id, exc)


def _title(incoming: Sequence[Mapping[str, Any]]) -> str:
    for message in incoming:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str):
            return " ".join(content.split())[:60]
    return ""
