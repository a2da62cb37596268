"""The relational core of the sqlite and postgresql stores: the logic once, two dialects.

Both keep a conversation as rows: a head row in ``conversations`` (title, times,
metadata, message count and last hash), one ``messages`` row per message whose
body is the canonical JSON its hash covers, at most one ``partials`` row, and a
``leases`` row per writer lease. What differs is the SQL dialect (parameter
marks, row locks) and the connection (sqlite's one shared connection with group
commit, postgresql's pool): each store supplies a ``Dialect`` and the few hooks
declared abstract below.

Compare-and-append is one transaction that reads the head (locked where the
server has row locks; sqlite's BEGIN IMMEDIATE already serialises writers),
checks the new messages chain from it, inserts them under the primary key
``(conversation_id, seq)`` and moves the head. A fenced write reads the lease
row in that same transaction, so no other writer can take the lease between the
check and the commit. A chain is verified in full the first time this process
writes to it and whenever its head moved under it (``_verified_count``).
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from chatstate._gcpause import paused
from chatstate.core.canonical import chain_hash
from chatstate.core.transcript import (
    Conversation,
    ConversationSummary,
    Message,
    now_iso,
    validate_id,
)
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationNotFound,
    CorruptTranscriptError,
    StoreUnavailable,
)
from chatstate.stores._rows import decode_rows, row_message, row_text
from chatstate.stores.base import (
    CheckReport,
    PreparedBatch,
    check_append,
    check_partial_commit,
    check_rewrite,
)
from chatstate.stores.blobs import check_stored_blobs, named_blobs, refuse_unheld_blobs
from chatstate.stores.leases import Holder, Lease, check_fence


@dataclass(frozen=True)
class Dialect:
    """What the SQL of the two stores differs in. Queries are written with ``?`` marks."""

    mark: str = "?"
    """The driver's parameter mark: ``?`` (sqlite3) or ``%s`` (psycopg)."""
    for_update: str = ""
    """Appended to a read of the row a write then changes ('' where the transaction
    itself serialises writers, as BEGIN IMMEDIATE does)."""
    for_share: str = ""
    """Appended to a read of a row that must not change before the commit."""
    body: str = "body"
    """How a body column is selected: sqlite reads bytes, to name bad UTF-8 itself."""
    no_limit: int | None = None
    """The LIMIT that means none."""
    message_body: str = ""
    """How a messages row's body is selected, if not as ``body`` is (sqlite keeps long
    bodies in a table of their own)."""

    def sql(self, query: str) -> str:
        return query if self.mark == "?" else query.replace("?", self.mark)


HEAD = ("SELECT id, title, created_at, updated_at, metadata, message_count, last_hash "
        "FROM conversations WHERE id=?")


class RelationalStore(ABC):
    """Conversations, partial replies, fencing and bookkeeping over SQL rows."""

    url: str
    dialect: ClassVar[Dialect]
    check_errors: ClassVar[tuple[type[BaseException], ...]] = (ChatstateError,)
    """What ``check()`` reports rather than raises."""
    writes_pieces: ClassVar[bool] = False
    """The store writes a long reply's body in pieces (``PreparedBatch``'s ``pieces``,
    ``Message.body_pieces``; sqlite's incremental blob writes), not bound whole."""

    sees_commits: ClassVar[bool] = False
    """``_version`` moves whenever another connection commits (sqlite's data_version):
    a chain verified at a version is unchanged while the version is."""

    _seen: dict[str, tuple[int, int, str | None]]
    """Per conversation: (version, count, last hash) when its chain last verified (each
    store's ``__init__`` sets it to {})."""

    # -- hooks ------------------------------------------------------------------------
    @abstractmethod
    def _write(self, action: str) -> AbstractContextManager[Any]:
        """A connection inside one write transaction, durable when the block ends."""

    @abstractmethod
    def _snapshot(self, action: str) -> AbstractContextManager[Any]:
        """A connection inside one read-only snapshot."""

    @abstractmethod
    def _where(self, cid: str) -> str:
        """How errors name the conversation (the file or server, and the id)."""

    @abstractmethod
    def _shown(self) -> str:
        """Where the rows are (the file, the server and schema), for check() and LeaseLost."""

    @abstractmethod
    def _held_blob_sizes(self, db: Any, digests: list[str]) -> dict[str, int]:
        """Stored sizes of these blobs (absent ones left out)."""

    @abstractmethod
    def _blob_where(self, sha256: str) -> str: ...

    @abstractmethod
    def _insert_messages(self, db: Any, cid: str, fresh: Sequence[Message],
                         bodies: Sequence[str]) -> None:
        """Insert the message rows (``bodies``: each one's ``body()``); ConflictError when
        another writer took a seq."""

    def _load_snapshot(self) -> AbstractContextManager[Any]:
        """The snapshot a load reads its rows in (the store may read it otherwise)."""
        return self._snapshot("read")

    def _insert_prepared(self, db: Any, cid: str, prepared: PreparedBatch,
                         already: int) -> None:
        """Insert the rows of ``prepared`` from position ``already`` (a store that
        ``writes_pieces`` takes the long bodies in ``prepared.pieces`` itself)."""
        self._insert_messages(db, cid, prepared.messages[already:], prepared.bodies[already:])

    def _delete_messages(self, db: Any, cid: str) -> None:
        """Every message row of ``cid`` (``rewrite``)."""
        self._q(db, "DELETE FROM messages WHERE conversation_id=?", (cid,))

    def _partial_body(self, partial: Message) -> str | None:
        """``partial``'s body, made before the write lock is taken (CPU in proportion to
        the reply: it must not hold the other writers back); None when the store writes
        it in pieces itself (sqlite's long bodies)."""
        return partial.body()

    def _put_partial(self, db: Any, cid: str, partial: Message, body: str | None) -> None:
        """Write ``partial`` (its body ``body``, from ``_partial_body``) as the
        conversation's one partial row."""
        self._q(db, "INSERT INTO partials (conversation_id, seq, body) VALUES (?, ?, ?) "
                "ON CONFLICT (conversation_id) DO UPDATE SET seq=excluded.seq, "
                "body=excluded.body", (cid, partial.seq, partial.body() if body is None
                                       else body))

    def _version(self, db: Any) -> int:
        """A number that changes when another connection commits (0: not known)."""
        return 0

    def _scrub(self, text: str) -> str:
        return text

    def _q(self, db: Any, query: str, params: Sequence[Any] = ()) -> Any:
        return db.execute(self.dialect.sql(query), tuple(params))

    # -- reads ------------------------------------------------------------------------
    def _header(self, db: Any, cid: str, lock: str = "") -> tuple[Any, ...]:
        row = self._q(db, HEAD + lock, (validate_id(cid),)).fetchone()
        if row is None:
            raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
        return tuple(row)

    def _chain(self, db: Any, cid: str, head: tuple[Any, ...]) -> list[Message]:
        """Every stored message, chain verified, and its tail checked against the head row."""
        return self._decoded(cid, head, self._rows(db, cid), self._version(db))[0]

    def _rows(self, db: Any, cid: str) -> list[Any]:
        body = self.dialect.message_body or self.dialect.body
        rows = self._q(db, f"SELECT seq, {body}, hash FROM messages WHERE "
                       "conversation_id=? ORDER BY seq", (cid,)).fetchall()
        if rows and isinstance(rows[0][1], str):  # a text column: decode_rows hashes bytes
            rows = [(seq, body.encode(), hash_) for seq, body, hash_ in rows]
        return list(rows)

    def _decoded(self, cid: str, head: tuple[Any, ...], rows: list[Any], version: int
                 ) -> tuple[list[Message], bool]:
        """The rows as messages, chain verified (no connection needed: run it outside the
        snapshot, so decoding a long conversation holds no other reader or writer back),
        and whether all their contents are strings (``decode_rows``: none names a blob)."""
        where = self._where(cid)
        messages, texts = decode_rows(rows, where)
        if len(messages) != head[5] or (messages[-1].hash if messages else None) != head[6]:
            # the chain cannot see its own tail cut off; the conversation row can
            position = min(head[5], len(messages))
            raise CorruptTranscriptError(
                f"{where}: the conversation row records {head[5]} messages but {len(messages)} "
                f"are stored (cut off or added by hand from seq {position}); the database "
                "was left as it is", where=where, position=position)
        self._seen[cid] = (version, head[5], head[6])
        return messages, texts

    def _verified_count(self, db: Any, cid: str, lock: str = "",
                        head: tuple[Any, ...] | None = None) -> int:
        """The stored message count, once the chain verifies: never write onto damage.

        The full check is skipped while the head is the one this process last
        verified (and, on sqlite, no other connection has committed since).
        ``head``: the head row, when the caller has read it (``_fenced_head``).
        """
        if head is None:
            head = self._header(db, cid, lock)
        if self._seen.get(cid) != (self._version(db), head[5], head[6]):
            self._chain(db, cid, head)
        return int(head[5])

    def _partial_row(self, db: Any, cid: str) -> tuple[int, bytes] | None:
        row = self._q(db, f"SELECT seq, {self.dialect.body} FROM partials WHERE "
                      "conversation_id=?", (cid,)).fetchone()
        return (int(row[0]), _raw(row[1])) if row is not None else None

    def _partial_message(self, cid: str, row: tuple[int, bytes], prev: str | None) -> Message:
        """The partial row as a Message, its hash chained from ``prev`` (the hash before it)."""
        where, (seq, raw) = self._where(cid), row
        text = row_text(raw, where, seq)
        return row_message(text, chain_hash(prev, text), where, seq)

    def load(self, conversation_id: str) -> Conversation:
        cid = conversation_id
        with paused():  # the rows and records made are many, and none in a cycle
            with self._load_snapshot() as db:  # one snapshot: header, messages, partial
                head = self._header(db, cid)
                rows, version = self._rows(db, cid), self._version(db)
                row = self._partial_row(db, cid)
            # decoded after the snapshot: CPU in proportion to the conversation, lock-free
            messages, texts = self._decoded(cid, head, rows, version)
            del rows
        partial = None
        if row is not None and row[0] == len(messages):  # not a stale row of an older seq
            partial = self._partial_message(cid, row, messages[-1].hash if messages else None)
        named = [*messages, *([partial] if partial else [])]
        # (texts: no stored message names a blob; the partial reply still may)
        digests = list(named_blobs(named if not texts else [partial] if partial else []))
        if digests:  # blobs are written before the messages naming them, and kept while named
            with self._snapshot("read") as db:
                sizes = self._held_blob_sizes(db, digests)
            check_stored_blobs(self._where(cid), named, sizes.get, self._blob_where)
        return Conversation.model_construct(
            id=head[0], title=head[1], created_at=head[2], updated_at=head[3],
            metadata=json.loads(head[4]), messages=messages, partial=partial)

    def stored_rows(self, conversation_id: str) -> tuple[
            tuple[Any, ...], list[tuple[int, bytes, str]], tuple[int, bytes] | None]:
        """The head row, every (seq, body, hash) message row and the partial row, as
        stored, read in one snapshot and not parsed: the encrypted store's fast load
        (``chatstate.stores.sealed``) verifies and opens them itself."""
        cid = conversation_id
        with self._snapshot("read") as db:
            head = self._header(db, cid)
            rows = self._rows(db, cid)  # sqlite's: no long-body test per row unless needed
            partial = self._partial_row(db, cid)
        if self.dialect.body == "body":  # a text column: the caller hashes bytes
            rows = [(int(seq), _raw(body), str(h)) for seq, body, h in rows]
        # else (sqlite's CAST AS BLOB) the rows are (int, bytes, str) as fetched; a row
        # edited by hand to hold other types fails the caller's seq or hash check
        return head, list(rows), partial

    def blob_sizes(self, digests: list[str]) -> dict[str, int]:
        """Stored sizes of these blobs (absent ones left out)."""
        with self._snapshot("read") as db:
            return self._held_blob_sizes(db, digests)

    def list_conversations(self, limit: int | None = None) -> list[ConversationSummary]:
        with self._snapshot("list") as db:
            rows = self._q(db, "SELECT id, title, created_at, updated_at, message_count FROM "
                           "conversations ORDER BY updated_at DESC LIMIT ?",
                           (self.dialect.no_limit if limit is None else limit,)).fetchall()
        return [ConversationSummary(id=r[0], title=r[1], created_at=r[2], updated_at=r[3],
                                    message_count=r[4]) for r in rows]

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


def _raw(body: bytes | str) -> bytes:
    return body if isinstance(body, bytes) else body.encode()
