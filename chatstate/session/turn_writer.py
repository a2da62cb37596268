"""The turn writer: the one place a turn's writes are made, in the one order.

A turn: seal and append the user message (durable before the request leaves),
call the model with the whole transcript, append the reply, and only then hand
text to the caller (persist -> call -> persist -> render). While streaming,
each piece of text is written as the conversation's partial reply before it is
yielded (group commit: the deltas that arrive during one write go into the
next), so whatever a caller has shown is a prefix of what is stored; the
complete reply is appended into the chain before its last piece is yielded.

``TurnWriter`` holds one conversation's state in memory and makes every write
of it: sealing messages after the current last one, compare-and-append (which
also drops a partial the append covers), partial saves, committing the reply
(and the divergence note when the final reply does not extend what was shown),
header and metadata updates, settling a stored partial into the chain, and the
writer lease. ``Chat``, the model round, the tool loop, context fitting,
``serve`` and the framework integrations all write through it; none of them
calls a store's ``append``, ``save_partial``, ``clear_partial`` or ``set_header``.

Fencing: while the writer holds the conversation's lease (``hold``), every write
carries ``fence=`` the lease's owner token, and a store with leases refuses a
write whose token is no longer the current owner (``LeaseLost``). A writer that
lost its lease, because a write was refused or because the renewal thread found
another writer holding it, stops: it writes nothing more, its caller shows
nothing more, and ``LeaseLost`` says what of its reply was kept. A write made
with no lease held (``Chat.add_system`` between turns, the integrations' item
appends), and every write to a store without leases (or a third-party store that
predates the ``fence`` keyword), is unfenced: its compare-and-append still
guarantees no lost turns.

A partial reply is never dropped: before a new reply is written for that turn
(or a new turn starts) it is committed into the chain with status ``partial``,
and only if the store still holds exactly that partial: one that changed since
it was loaded belongs to a live writer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chatstate.core.transcript import Conversation, Message, new_id, now_iso
from chatstate.errors import ChatstateError, ConflictError, ConversationInUse, LeaseLost
from chatstate.ops.request_log import UPSTREAM_ERROR_KEY as UPSTREAM_ERROR_KEY
from chatstate.session.writer_lease import Held, hold
from chatstate.stores.base import LEASE_TERM, Store, create_leased

log = logging.getLogger("chatstate.session")

DIVERGENT_KEY = "divergent_replies"


class TurnWriter:
    """Every write of one conversation, fenced by the writer lease while it is held.

    ``conversation`` is the in-memory state (kept in step with each write);
    ``created`` whether the store has it yet. ``owner`` is the lease's owner token
    (a writer re-takes its own lease at once); ``lease_wait`` how long ``hold``
    waits for another live writer before ConversationInUse.
    """

    def __init__(self, store: Store, conversation: Conversation, *, created: bool,
                 owner: str | None = None, lease_term: float = LEASE_TERM,
                 lease_wait: float = 0.0) -> None:
        self.store = store
        self.conversation = conversation
        self.created = created
        self.owner = owner or new_id()
        self.lease_term, self.lease_wait = lease_term, lease_wait
        self.held: Held | None = None
        self._lost: LeaseLost | None = None
        self._kept = "Nothing of its reply was stored."

    @property
    def id(self) -> str:
        return self.conversation.id

    # -- the lease -----------------------------------------------------------------
    def hold(self) -> Held:
        """Take the writer lease before the turn writes anything (ConversationInUse)."""
        held = hold(self.store, self.id, self.owner, term=self.lease_term, wait=self.lease_wait)
        self.held, self._lost = held, None
        self._kept = "Nothing of its reply was stored."
        return held

    def start(self, messages: Sequence[Message]) -> Held:
        """Create the conversation with its first ``messages`` under a writer lease taken
        now, as one store write (``create_leased``: one transaction on sqlite and
        postgresql, one lock and two files on json), then keep renewing the lease as
        ``hold`` does. ConversationInUse, or ConflictError when the conversation exists
        already: then nothing was written and no lease is held."""
        batch = list(messages)
        lease = create_leased(self.store, self.conversation, batch, owner=self.owner,
                              term=self.lease_term, wait=self.lease_wait)
        held = Held(self.store, lease)
        self.held, self._lost = held, None
        self._kept = "Nothing of its reply was stored."
        self.created = True
        self.conversation.messages = self.conversation.messages + batch
        log.debug("%s: created with %d messages", self.id, len(batch))
        return held

    def release(self, held: Held | None = None) -> None:
        """Give the lease up: ``held`` (taken by ``hold``), else the one held now. A no-op
        if none is held; the store's no-op if another writer has it now."""
        held = held or self.held
        if held is self.held:
            self.held = None
        if held is not None:
            held.release()

    @property
    def fence(self) -> str | None:
        """The owner token every write carries: the held lease's, None without one."""
        lease = self.held.lease if self.held is not None else None
        return lease.owner if lease is not None else None

    @property
    def lost(self) -> LeaseLost | None:
        """The LeaseLost this writer's turn stopped with (or would stop with now)."""
        if self._lost is None and self.held is not None and self.held.lost is not None:
            self._lost = self._lost_error(self.held.lost)
        return self._lost

    def check(self) -> None:
        """Raise LeaseLost if another writer took the conversation over."""
        lost = self.lost
        if lost is not None:
            raise lost

    def _lost_error(self, cause: BaseException) -> LeaseLost:
        if isinstance(cause, ConversationInUse):
            who = f"host {cause.host}, pid {cause.pid} took over its writer lease"
        else:
            who = f"the store says: {cause}"
        return LeaseLost(
            f"conversation {self.id!r}: this writer lost the conversation to another writer "
            f"({who}), so its turn stopped: it wrote and showed nothing more. {self._kept}",
            fence=self.fence or "")

    def _write(self, method: str, write: Callable[[dict[str, Any]], None]) -> None:
        """One store write, ``write(fence keyword)``; refused at once once the lease is lost.

        The fence goes with every write while the lease is held: a store with leases
        takes it (the shipped contract suite holds it to that); a store without leases
        holds no lease, so its writes carry none.
        """
        self.check()
        fence = self.fence
        fenced: dict[str, Any] = {"fence": fence} if fence is not None else {}
        try:
            write(fenced)
        except LeaseLost as exc:
            self._lost = self._lost_error(exc)
            log.warning("%s: %s", self.id, self._lost)
            raise self._lost from exc

    # -- the chain -----------------------------------------------------------------
    def create(self) -> bool:
        """Create the conversation if the store has none; False if another writer did
        meanwhile (reload to continue theirs)."""
        if self.created:
            return True
        self.check()
        try:
            self.store.create(self.conversation)
        except ConflictError:
            self.created = True
            return False
        self.created = True
        return True

    def seal(self, **fields: Any) -> Message:
        """A message sealed after the current last one (``Message.seal`` keywords)."""
        return Message.seal(self.conversation.last, **fields)

    def append(self, messages: Sequence[Message]) -> None:
        """Compare-and-append ``messages``; a partial they cover is dropped from memory."""
        batch = list(messages)
        if not batch:
            return
        self._write("append", lambda fence: self.store.append(self.id, batch, **fence))
        log.debug("%s: stored %s", self.id, ", ".join(
            f"seq {m.seq} ({m.role}, {m.status}, turn {m.turn_id})" for m in batch))
        conv = self.conversation
        conv.messages = conv.messages + batch
        if conv.partial is not None and conv.partial.seq <= batch[-1].seq:
            conv.partial = None

    def settle_partial(self) -> bool:
        """Commit the stored partial reply into the chain, so it is kept, visibly, as partial.

        Only the partial the store still holds: one that changed since it was loaded
        is being streamed by a live writer, and committing the older copy would drop
        text that writer has already shown. Then the conversation is reloaded and
        False returned (the caller decides whether the other writer's turn is done).
        """
        partial = self.conversation.partial
        if partial is None:
            return True
        current = self.store.load(self.id)
        if (current.last_seq != self.conversation.last_seq or current.partial is None
                or current.partial.hash != partial.hash):
            self.conversation = current
            return False
        self.append([partial])
        return True

    # -- the reply -----------------------------------------------------------------
    def save_partial(self, turn_id: str, text: str, model: str | None, *,
                     quiet: bool = False, keep: bool = True) -> Message | None:
        """Write the reply so far as the conversation's partial reply.

        ``quiet``: keeping what arrived when the turn ends early; a failure is logged,
        not raised (the turn's own error goes on), and a lost lease writes nothing.
        ``keep=False``: the partial is not kept in ``conversation.partial`` (the store
        has it; the caller holds the text): a caller whose reply grows long (``serve``)
        then holds no older copy of it beside the one it extends.
        """
        if quiet and self.lost is not None:
            return None
        partial = self.seal(role="assistant", content=text, turn_id=turn_id,
                            status="partial", model=model)
        try:
            self._write("save_partial",
                        lambda fence: self.store.save_partial(self.id, partial, **fence))
        except ChatstateError as exc:
            if not quiet:
                raise
            log.warning("%s: could not keep the interrupted reply (%d chars at seq %d) as a "
                        "partial: %s", self.id, len(text), partial.seq, exc)
            return None
        self.conversation.partial = partial if keep else None
        self._kept = (f"Of its reply, {len(text)} characters were kept as the partial reply "
                      f"at seq {partial.seq}.")
        return partial

    def reply(self, turn_id: str, **fields: Any) -> Message:
        """Append the turn's complete reply (``Message.seal`` keywords)."""
        message = self.seal(role="assistant", turn_id=turn_id, **fields)
        self.append([message])
        self._kept = (f"Its reply is stored complete at seq {message.seq} "
                      f"({len(message.text or '')} characters).")
        return message

    def commit(self, turn_id: str, done: Any, shown: str = "",
               requested: str | None = None) -> str:
        """Append the model's complete reply (a Completion); return the part of it not
        yet shown. When it does not extend what was shown, that is noted."""
        from chatstate.core.tools import unique_call_ids

        finish = done.finish_reason if done.finish_reason not in (None, "stop") else None
        reply = self.reply(turn_id, content=done.text, model=done.model, usage=done.usage,
                           finish_reason=finish,
                           requested_model=requested if requested != done.model else None,
                           tool_calls=unique_call_ids(getattr(done, "tool_calls", None)),
                           extra=getattr(done, "extra", None))
        if done.text.startswith(shown):
            return str(done.text[len(shown):])
        self.note_divergent(reply.seq, len(shown))
        return ""

    def note_divergent(self, seq: int, shown_chars: int) -> None:
        """The final reply does not extend what was shown: say so, and keep the fact."""
        log.warning("%s: the final reply at seq %d does not extend the %d chars already "
                    "shown; the stored reply is the final one (see `chatstate replay`)",
                    self.id, seq, shown_chars)
        notes = [*self.conversation.metadata.get(DIVERGENT_KEY, []),
                 {"seq": seq, "shown_chars": shown_chars}]
        try:
            self.update_metadata({DIVERGENT_KEY: notes})
        except ChatstateError as exc:  # the reply is stored; only the note is missing
            log.warning("%s: could not record the divergent reply in the metadata: %s",
                        self.id, exc)

    def note_upstream_error(self, turn_id: str, status: int, detail: str,
                            **facts: Any) -> None:
        """Say in the metadata why the turn has no reply (an upstream error); ``facts``:
        more about it (the request's duration, the upstream's request id)."""
        try:
            self.update_metadata({UPSTREAM_ERROR_KEY: {
                **facts, "status": status, "detail": detail[:500], "turn_id": turn_id,
                "at": now_iso()}})
        except Exception as exc:  # the reply is already lost upstream; do not mask that
            log.warning("%s: could not record the upstream error: %s", self.id, exc)

    # -- the header ----------------------------------------------------------------
    def set_title(self, title: str) -> None:
        from chatstate.core.canonical import well_formed

        title = well_formed(title)  # as a message's text is (Message.seal)
        self._write("set_header",
                    lambda fence: self.store.set_header(self.id, title=title, **fence))
        self.conversation.title = title

    def update_metadata(self, changes: Mapping[str, Any]) -> None:
        """Store the conversation's metadata with ``changes`` merged in."""
        metadata = {**self.conversation.metadata, **changes}
        self._write("set_header",
                    lambda fence: self.store.set_header(self.id, metadata=metadata, **fence))
        self.conversation.metadata = metadata
