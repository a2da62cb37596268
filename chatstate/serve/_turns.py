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

Each request is planned within the caller's namespace (``_auth``): a conversation
of another namespace is never loaded for it. A request the proxy has seen (the same
``Idempotency-Key``, or the same body within ``REPLAY_WINDOW``) answers the turn it
stored: with the stored reply when there is one (``Replay``), else by sending that
turn upstream again. Its key is kept in ``params["request"]`` of the request's last
message, so a proxy restarted after ``kill -9`` knows it too. A fixed conversation
id whose history diverged once follows the fork it made.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from chatstate.core.canonical import well_formed
from chatstate.core.transcript import Conversation, Message, new_id, new_turn_id
from chatstate.errors import ConflictError, ConversationInUse, ConversationNotFound, LeaseLost
from chatstate.serve._history import (
    Ambiguous,
    HistoryIndex,
    Plan,
    message_fields,
    namespace_of,
    reconcile,
    visible,
)
from chatstate.serve._request_record import REQUEST
from chatstate.session.turn_writer import TurnWriter
from chatstate.stores.base import LEASE_TERM, Store

log = logging.getLogger("chatstate.serve")

REPLAY_WINDOW = 600.0
"""Seconds within which the same body again is a retry (an ``Idempotency-Key`` has no
limit): after that, the same question asked again gets a new answer."""

SEAL_FIELDS = ("role", "content", "created_at", "turn_id", "status", "model", "usage", "params",
               "tool_calls", "tool_call_id", "name", "extra")


class ForeignConversation(Exception):
    """The conversation id names a conversation of another namespace."""


@dataclass
class Replay:
    """A request seen before whose reply is stored: answer with that reply."""

    conversation: Conversation
    reply: Message


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

    def _load(self, namespace: str, conversation_id: str | None) -> Conversation | None:
        """The conversation, if it exists; ForeignConversation if another namespace's."""
        if conversation_id is None:
            return None
        try:
            conv: Conversation = self.store.load(conversation_id)
        except ConversationNotFound:
            return None
        if namespace_of(conv) != namespace:
            raise ForeignConversation(conversation_id)
        return conv

    def begin(self, conversation_id: str | None, incoming: Sequence[Mapping[str, Any]], *,
              namespace: str = "", key: str | None = None, keyed: bool = False,
              record: Mapping[str, Any] | None = None) -> Turn | Replay:
        """Make the request's new messages durable; returns the turn to answer, holding
        the lease of the conversation it writes (``end`` gives it up), or the Replay of
        a request (``key``; ``keyed``: the client's Idempotency-Key) already answered.
        ``record``: what the request asked for (``_request_record``), kept with its key
        in the last new message's ``params["request"]``.

        ConversationInUse if another live writer holds it for longer than ``lease_wait``;
        ForeignConversation if ``conversation_id`` is another namespace's.
        """
        for attempt in (1, 2):
            seen = self._seen(namespace, key, keyed)
            if isinstance(seen, Replay):
                return seen
            plan = self._plan(namespace, conversation_id, incoming, seen)
            writer = self._writer_for(plan, incoming, namespace)
            try:
                turn = self._start(writer, plan, key, record) if self._new(writer, plan) \
                    else self._held_write(writer, plan, key, record)
            except BaseException as exc:
                if attempt == 2 or not isinstance(exc, ConflictError) \
                        or isinstance(exc, ConversationInUse | LeaseLost):
                    raise  # another writer keeps moving this conversation on
                continue  # it moved between our load and our lease: plan again
            self.index.note(namespace, turn.conversation)
            if key is not None:
                self.index.remember_request(namespace, key, turn.id, turn.turn_id)
            return turn
        raise AssertionError("unreachable")

    def _seen(self, namespace: str, key: str | None, keyed: bool
              ) -> Replay | Conversation | None:
        """For a request seen before: the Replay of its reply, or the conversation its
        unanswered turn is in. None for a new request."""
        known = self.index.request(namespace, key) if key is not None else None
        if known is None:
            return None
        try:
            conv = self._load(namespace, known[0])
        except ForeignConversation:
            return None
        turn = [m for m in conv.messages if m.turn_id == known[1]] if conv else []
        if conv is None or not turn or (not keyed and _age(turn[0]) > REPLAY_WINDOW):
            return None
        replies = [m for m in turn if m.role == "assistant" and m.status == "complete"]
        return Replay(conv, replies[-1]) if replies else conv

    def _plan(self, namespace: str, conversation_id: str | None,
              incoming: Sequence[Mapping[str, Any]], seen: Conversation | None) -> Plan:
        if seen is not None:  # the same request again: the conversation it went to
            plan = reconcile(seen, seen.id, new_id("p"), incoming)
            if plan.fork_of is None:
                return plan
        matched: list[str] = []
        cid = conversation_id
        if cid is None:
            try:
                cid = self.index.find(namespace, incoming)
            except Ambiguous as exc:
                matched = exc.matched
        plan = reconcile(self._load(namespace, cid), cid or new_id("p"), new_id("p"),
                         incoming)
        plan.matched = matched
        return self._follow(namespace, plan, incoming)

    def _follow(self, namespace: str, plan: Plan, incoming: Sequence[Mapping[str, Any]]
                ) -> Plan:
        """A history that forked once continues in its fork, not in a fork per turn."""
        seen: set[str] = set()
        while plan.fork_of is not None:
            follower = self.index.follower(plan.fork_of.id)
            if follower is None or follower in seen:
                break
            seen.add(follower)
            try:
                conv = self._load(namespace, follower)
            except ForeignConversation:
                break
            if conv is None:
                break
            candidate = reconcile(conv, follower, plan.conversation_id, incoming)
            if candidate.fork_of is None:
                return candidate
            if candidate.common < plan.common:
                break
            plan = candidate
        return plan

    def _writer_for(self, plan: Plan, incoming: Sequence[Mapping[str, Any]],
                    namespace: str = "") -> TurnWriter:
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
                                metadata={**_header(namespace), "forked_from": forked_from})
        elif plan.stored is None:
            metadata = _header(namespace)
            if plan.matched:
                metadata["ambiguous_history"] = {"matched": plan.matched}
            conv = Conversation(id=plan.conversation_id, title=title_of(incoming),
                                metadata=metadata)
        else:
            conv = plan.stored
        return TurnWriter(self.store, conv, created=plan.stored is not None
                          and plan.fork_of is None, owner=secrets.token_hex(8),
                          lease_term=self.lease_term, lease_wait=self.lease_wait)

    def end(self, turn: Turn) -> None:
        """The turn is over: give its lease up (it lapses by itself if this fails)."""
        turn.writer.release()

    @staticmethod
    def _new(writer: TurnWriter, plan: Plan) -> bool:
        """A conversation the store does not have yet, and not a fork (which copies the
        history it keeps first)."""
        return not writer.created and plan.fork_of is None

    def _start(self, writer: TurnWriter, plan: Plan, key: str | None,
               record: Mapping[str, Any] | None) -> Turn:
        """A new conversation: its lease, its header and the request's messages in one
        store write (``TurnWriter.start``), the one write before the request goes
        upstream. ConflictError (nothing written, no lease held) if another writer
        created it meanwhile."""
        turn = Turn(writer, new_turn_id())
        writer.start(self._sealed(plan, None, turn.turn_id, key, record))
        return turn

    def _held_write(self, writer: TurnWriter, plan: Plan, key: str | None,
                    record: Mapping[str, Any] | None) -> Turn:
        """A stored conversation (or a fork): take its lease, then write."""
        held = writer.hold()
        try:
            return self._write(writer, plan, key, record)
        except BaseException:
            writer.release(held)
            raise

    @staticmethod
    def _sealed(plan: Plan, last: Message | None, turn_id: str, key: str | None,
                record: Mapping[str, Any] | None) -> list[Message]:
        """The request's new messages sealed after ``last``, the request's record and key
        in the last one's ``params["request"]``."""
        sealed: list[Message] = []
        for i, raw in enumerate(plan.new):
            prev = sealed[-1] if sealed else last
            final = i == len(plan.new) - 1
            params = {REQUEST: {**(record or {}), **({"key": key} if key else {})}} \
                if final and (key or record) else None
            sealed.append(Message.seal(prev, turn_id=turn_id, params=params,
                                       **message_fields(raw)))
        return sealed

    def _write(self, writer: TurnWriter, plan: Plan, key: str | None = None,
               record: Mapping[str, Any] | None = None) -> Turn:
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
            writer.append(self._sealed(plan, conv.last, turn.turn_id, key, record))
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
        # not kept in memory: the relay holds the text, once
        turn.writer.save_partial(turn.turn_id, text, model, keep=False)

    def commit(self, turn: Turn, reply: Mapping[str, Any]) -> Message:
        """Append the complete reply (``Message.seal`` keywords; ``params["response"]``:
        how the upstream answered) and index the new history."""
        message = turn.writer.reply(turn.turn_id, **reply)
        self.index.add(turn.conversation)
        return message

    def note_failure(self, turn: Turn, status: int, detail: str,
                     found: Mapping[str, Any] | None = None) -> None:
        """Say in the transcript why the turn has no reply (an upstream error); ``found``:
        the request's outcome (``_request_record.outcome``)."""
        facts = {k: v for k, v in (found or {}).items() if k != "status"}
        turn.writer.note_upstream_error(turn.turn_id, status, detail, **facts)


def _header(namespace: str) -> dict[str, Any]:
    return {"via": "serve", "namespace": namespace} if namespace else {"via": "serve"}


def _age(message: Message) -> float:
    try:
        at = datetime.fromisoformat(message.created_at.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (datetime.now(timezone.utc) - at).total_seconds()


def title_of(incoming: Sequence[Mapping[str, Any]]) -> str:
    """A new conversation's title: its first user message, as far as it is text."""
    for message in incoming:
        content = message.get("content")
        if message.get("role") != "user":
            continue
        if isinstance(content, list):  # content parts: the text ones
            content = " ".join(str(p.get("text", "")) for p in content
                               if isinstance(p, dict) and p.get("type") == "text")
        if isinstance(content, str) and content.strip():
            return well_formed(" ".join(content.split())[:60])
    return ""
