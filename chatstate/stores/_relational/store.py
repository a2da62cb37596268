"""The relational core's writes (``RelationalStore``): fenced, compare-and-append, in one
transaction each; creation with a lease, partial replies, headers, the opens log, check()."""

from __future__ import annotations

import json
import os
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from chatstate.core.transcript import (
    Conversation,
    Message,
    now_iso,
    validate_id,
)
from chatstate.errors import (
    ConflictError,
    StoreUnavailable,
)
from chatstate.stores._relational._reads import RelationalReads
from chatstate.stores.base import (
    CheckReport,
    PreparedBatch,
    check_append,
    check_partial_commit,
    check_rewrite,
)
from chatstate.stores.blobs import named_blobs, refuse_unheld_blobs
from chatstate.stores.leases import Holder, Lease, check_fence


class RelationalStore(RelationalReads):
    """Conversations, partial replies, fencing and bookkeeping over SQL rows."""

    # -- writes -----------------------------------------------------------------------
    def _check_fence(self, db: Any, cid: str, fence: str | None) -> None:
        """LeaseLost unless ``fence`` owns the lease row, read in the write's transaction
        (and held against a takeover until it commits)."""
        if fence is None:
            return
        row = self._q(db, "SELECT owner, host, pid FROM leases WHERE conversation_id=?"
                      + self.dialect.for_share, (validate_id(cid),)).fetchone()
        record = dict(zip(("owner", "host", "pid"), row, strict=True)) if row else None
        check_fence(self._shown(), cid, fence, record)

    def _fenced_head(self, db: Any, cid: str, fence: str | None, lock: str = ""
                     ) -> tuple[Any, ...]:
        """The head row, once ``fence`` is checked (``_check_fence``), in the write's
        transaction: LeaseLost before ConversationNotFound. Two queries here; a store
        may read both rows in one."""
        self._check_fence(db, cid, fence)
        return self._header(db, cid, lock)

    def _insert_head(self, db: Any, conversation: Conversation,
                     last: Message | None = None) -> None:
        """A new conversation's head row (ConflictError if the id is taken). ``last``: the
        last of the messages written with it in the same transaction (``_create_new``),
        so the row stands as it will after them."""
        cid = validate_id(conversation.id)
        columns = "id, title, created_at, updated_at, metadata"
        values: list[Any] = [cid, conversation.title, conversation.created_at,
                             conversation.updated_at, json.dumps(conversation.metadata)]
        if last is not None:
            columns += ", message_count, last_hash"
            values[3] = now_iso()
            values += [last.seq + 1, last.hash]
        added = self._q(db, f"INSERT INTO conversations ({columns}) VALUES "
                        f"({', '.join('?' * len(values))}) ON CONFLICT DO NOTHING",
                        values).rowcount
        if not added:
            raise ConflictError(f"conversation {cid!r} already exists in {self.url}")

    def create(self, conversation: Conversation) -> None:
        with self._write("create a conversation in") as db:
            self._insert_head(db, conversation)

    @abstractmethod
    def _lease_in(self, db: Any, lease: Lease) -> Holder | None:
        """Take or extend ``lease`` inside the write transaction ``db`` (the store's lease
        hook, see ``_create_leased_once``)."""

    def _create_leased_once(self, lease: Lease, conversation: Conversation,
                            messages: list[Message]) -> Holder | None:
        """``create_leased`` as one transaction: the lease row, the head row and the
        message rows commit together or not at all (on sqlite, in the group commit of
        the writers queued with it)."""
        cid = validate_id(conversation.id)
        prepared = PreparedBatch(messages, pieces=self.writes_pieces) if messages else None
        # before the lock: whether the batch can start a conversation as it is (then the
        # store may write it without reading anything back, ``_create_new``)
        plain = prepared is None or (
            prepared.first_break(None, 0) is None and prepared.messages[0].status != "partial"
            and not any(True for _ in named_blobs(prepared.messages)))
        with self._write("start a conversation in") as db:
            if plain and self._create_new(db, lease, conversation, prepared):
                return None
            holder = self._lease_in(db, lease)
            if holder is not None:
                return holder
            self._insert_head(db, conversation)
            if prepared is not None:
                self._append_in(db, cid, prepared, lease.owner)
        return None

    def _create_new(self, db: Any, lease: Lease, conversation: Conversation,
                    prepared: PreparedBatch | None) -> bool:
        """``create_leased``'s write for a conversation no lease row names yet, inside the
        write transaction ``db``: True when written; False, with nothing written, when
        a lease row is there (``_create_leased_once`` then judges it, the long way).
        ``prepared`` chains from nothing, names no blob and is not a partial reply
        (checked before the lock). Here always False; a store may do it in fewer
        statements (sqlite)."""
        return False

    def append(self, conversation_id: str, messages: Sequence[Message], *,
               fence: str | None = None) -> None:
        # before the lock: CPU in proportion to the batch
        prepared = PreparedBatch(messages, pieces=self.writes_pieces)
        with self._write("append to") as db:
            self._append_in(db, conversation_id, prepared, fence)

    def _append_in(self, db: Any, cid: str, prepared: PreparedBatch,
                   fence: str | None) -> None:
        """The compare-and-append inside the write transaction ``db``."""
        where = self._where(cid)
        head = self._fenced_head(db, cid, fence, self.dialect.for_update)
        count = self._verified_count(db, cid, head=head)

        def hash_at(seq: int) -> str:
            if self.sees_commits and seq == count - 1 and head[6] is not None:
                # the head row's last hash: the tail of the chain ``_verified_count`` has
                # verified against it, unchanged since (no other connection committed), so
                # no read of the message row
                return str(head[6])
            row = self._q(db, "SELECT hash FROM messages WHERE conversation_id=? AND seq=?",
                          (cid, seq)).fetchone()
            return str(row[0]) if row else ""

        already = check_append(where, count - 1, hash_at, prepared.messages, prepared)
        fresh = prepared.messages[already:]
        if not fresh:
            return
        named = list(named_blobs(fresh))
        sizes = self._held_blob_sizes(db, named) if named else {}
        refuse_unheld_blobs(where, fresh, sizes.get)
        row = self._partial_row(db, cid) if fresh[0].status == "partial" else None
        if row is not None:
            held = self._partial_message(cid, row, hash_at(row[0] - 1) if row[0] else None)
            check_partial_commit(where, fresh, held)
        self._insert_prepared(db, cid, prepared, already)
        self._q(db, "UPDATE conversations SET message_count=?, last_hash=?, updated_at=? "
                "WHERE id=?", (fresh[-1].seq + 1, fresh[-1].hash, now_iso(), cid))
        self._seen[cid] = (self._version(db), fresh[-1].seq + 1, fresh[-1].hash)
        self._q(db, "DELETE FROM partials WHERE conversation_id=? AND seq<=?",
                (cid, fresh[-1].seq))

    def rewrite(self, conversation_id: str, messages: Sequence[Message], *,
                expect: str | None) -> None:
        """Every message row replaced in one transaction, the head moved with them
        (``Rewrites``: ``chatstate rekey``)."""
        cid = conversation_id
        where = self._where(cid)
        with self._write("rewrite") as db:
            count = self._verified_count(db, cid, self.dialect.for_update)
            head = self._header(db, cid)
            check_rewrite(where, count, head[6], expect, messages)
            if not messages:
                return
            self._delete_messages(db, cid)
            self._insert_messages(db, cid, messages, [m.body() for m in messages])
            self._q(db, "UPDATE conversations SET last_hash=? WHERE id=?",
                    (messages[-1].hash, cid))
            self._seen[cid] = (self._version(db), len(messages), messages[-1].hash)

    def save_partial(self, conversation_id: str, partial: Message, *,
                     fence: str | None = None) -> None:
        cid = conversation_id
        body = self._partial_body(partial)  # before the lock
        with self._write("save the partial reply in") as db:
            head = self._fenced_head(db, cid, fence, self.dialect.for_share)
            count = self._verified_count(db, cid, head=head)
            if partial.seq != count:
                raise ConflictError(f"{self._where(cid)}: partial reply for seq {partial.seq}, "
                                    f"but the next seq is {count}",
                                    expected_seq=partial.seq - 1, actual_seq=count - 1)
            self._put_partial(db, cid, partial, body)

    def clear_partial(self, conversation_id: str, *, fence: str | None = None) -> None:
        cid = validate_id(conversation_id)
        with self._write("clear the partial reply in") as db:
            self._check_fence(db, cid, fence)
            self._q(db, "DELETE FROM partials WHERE conversation_id=?", (cid,))

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None, fence: str | None = None) -> None:
        cid = conversation_id
        with self._write("update") as db:
            head = self._fenced_head(db, cid, fence, self.dialect.for_update)
            self._verified_count(db, cid, head=head)
            self._q(db, "UPDATE conversations SET title=coalesce(?, title), "
                    "metadata=coalesce(?, metadata), updated_at=? WHERE id=?",
                    (title, None if metadata is None else json.dumps(metadata), now_iso(), cid))

    # -- bookkeeping ------------------------------------------------------------------
    def record_open(self, record: dict[str, Any]) -> None:
        with self._write("record this open in") as db:
            self._q(db, "INSERT INTO opens (record) VALUES (?)",
                    (json.dumps(record, sort_keys=True),))

    def opens(self) -> list[dict[str, Any]]:
        with self._snapshot("read the opens of") as db:
            rows = self._q(db, "SELECT record FROM opens ORDER BY id").fetchall()
        return [json.loads(r[0]) for r in rows]

    def check(self) -> CheckReport:
        report = CheckReport(ok=False, url=self.url)
        key = f"probe-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            with self._write("write a probe to") as db:
                self._q(db, "INSERT INTO probes (id, value) VALUES (?, 'ok')", (key,))
            report.steps.append(f"wrote and committed a probe row to {self._shown()}")
            with self._snapshot("read a probe from") as db:
                row = self._q(db, "SELECT value FROM probes WHERE id=?", (key,)).fetchone()
            if row is None or row[0] != "ok":
                raise StoreUnavailable(f"{self._shown()}: the probe row did not read back")
            report.steps.append("read it back")
            with self._write("delete a probe from") as db:
                self._q(db, "DELETE FROM probes WHERE id=?", (key,))
            report.steps.append("deleted it")
            report.ok = True
        except self.check_errors as exc:
            report.error = self._scrub(str(exc))
        return report
