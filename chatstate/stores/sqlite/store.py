"""The sqlite store: one row per message, WAL, synchronous=FULL.

``PRIMARY KEY (conversation_id, seq)`` is the compare-and-append: two writers
racing for one seq cannot both insert it. Appends run in ``BEGIN IMMEDIATE``
transactions, so they are O(1) at any transcript length and serialised across
processes by SQLite's own locks (with a busy timeout).

WAL needs shared memory that network filesystems do not provide; on nfs/cifs/
sshfs the store falls back to a rollback journal with ``synchronous=EXTRA`` and
says so in ``recovery``. The database file is never opened with plain ``open()``
while a connection is live (that would drop SQLite's POSIX locks). The conversation logic
is the relational core's (``stores._relational``), shared with postgresql.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatstate.core.canonical import long_text
from chatstate.core.transcript import Conversation, Message, now_iso, validate_id
from chatstate.durable.files import ensure_dir
from chatstate.errors import ChatstateError, ConflictError, ConversationNotFound
from chatstate.stores._relational import Dialect, RelationalStore
from chatstate.stores.base import Location, PreparedBatch, local_path
from chatstate.stores.leases import Holder, Lease, check_fence
from chatstate.stores.sqlite._blobs import SqliteBlobs
from chatstate.stores.sqlite._lease import LEASE_ROW, SqliteLease, lease_values
from chatstate.stores.sqlite._schema import LONG_BODY, MESSAGE_BODY

if TYPE_CHECKING:
    from chatstate.stores.codec import Take

LOAD_MMAP = 1 << 30
"""The most of the database file a load maps (SQLite caps it lower where it must)."""
BLOB_SLICE = 1 << 20
"""Bytes written into a blob at a time."""
FENCED_HEAD = ("SELECT l.owner, l.host, l.pid, c.id, c.title, c.created_at, c.updated_at, "
               "c.metadata, c.message_count, c.last_hash FROM (SELECT ? AS k) q "
               "LEFT JOIN leases l ON l.conversation_id = q.k "
               "LEFT JOIN conversations c ON c.id = q.k")
"""A fenced write's two reads, the lease row's holder and the head row (``HEAD``'s
columns), as one (``SqliteStore._fenced_head``)."""


def _size(msg: Message) -> int:
    """Bytes of ``msg``'s body, made a slice at a time (``Message.body_pieces``)."""
    return sum(len(piece) for piece in msg.body_pieces())


def _row(msg: Message, body: str) -> str | bytes:
    """What a messages row holds: the body, or the binary row an encrypted store's sealed
    record offers for it (``codec.binary_row``: the same body, hash and chain, without
    base64; the relational core's reads expand it where they need the text)."""
    binary = getattr(msg, "binary", None)
    row = binary() if binary is not None and body != LONG_BODY else None
    return row if isinstance(row, bytes) else body


def _text(seq: int, body: bytes) -> str:
    """A stored body as text (a binary row as the body it stands for), for a dump: bytes
    that are not UTF-8 (the damage a dump is made for) kept as lone surrogates, which the
    dump escapes, so ``.encode("utf-8", "surrogateescape")`` gives them back exactly."""
    from chatstate.stores.codec import row_body  # only encrypted stores hold binary rows

    return row_body(seq, body).decode("utf-8", "surrogateescape")


def _write_blob(db: sqlite3.Connection, table: str, rowid: int, msg: Message) -> None:
    """``msg``'s body into the zeroblob ``body`` of row ``rowid`` of ``table``."""
    with db.blobopen(table, "body", rowid) as blob:  # type: ignore[attr-defined]
        for piece in msg.body_pieces():
            view = memoryview(piece)
            for at in range(0, len(view), BLOB_SLICE):
                blob.write(view[at:at + BLOB_SLICE])


class SqliteStore(SqliteLease, SqliteBlobs, RelationalStore):
    """Conversations in one SQLite database file. See the module docstring."""

    partial_flush_interval = 0.0
    dialect = Dialect(mark="?", body="CAST(body AS BLOB)", no_limit=-1,
                      message_body=MESSAGE_BODY)
    writes_pieces = hasattr(sqlite3.Connection, "blobopen")  # Python 3.11+
    check_errors = (ChatstateError, sqlite3.Error, OSError)
    sees_commits = True  # PRAGMA data_version

    def __init__(self, path: Path, url: str | None = None) -> None:
        super().__init__(path, url or f"sqlite://{path}")
        self._seen = {}

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        return cls(local_path(url, "sqlite:///abs/file.db"), url)

    def location(self) -> Location:
        return Location(url=self.url, path=str(self.path))

    # -- the relational core's hooks ---------------------------------------------------
    def _try_create_leased(self, lease: Lease, conversation: Conversation,
                           messages: list[Message]) -> Holder | None:
        return self._create_leased_once(lease, conversation, messages)  # one transaction

    def _create_new(self, db: sqlite3.Connection, lease: Lease, conversation: Conversation,
                    prepared: PreparedBatch | None) -> bool:
        """A new conversation in three statements: the lease row, the head row as it will
        stand after the batch, the message rows.

        The lease row first, a plain insert: when one is there already (the leases table
        has no foreign key, so a row can outlive its conversation or precede it: a lease
        taken on an id never created, a conversation deleted under a lease), nothing is
        written and the caller takes the long way, which judges that row as ever. With
        the lease row ours, a head row that exists already is the ConflictError of
        ``_insert_head`` (the exception undoes the lease row with the rest). A head
        row just inserted has no messages: message rows, long bodies and the partial
        row all reference it (foreign keys on, deletes cascading), so the batch, checked
        to chain from nothing before the lock, needs no count, fence or chain read back.
        """
        cid = validate_id(conversation.id)
        if not db.execute("INSERT " + LEASE_ROW + " ON CONFLICT DO NOTHING",
                          lease_values(cid, lease)).rowcount:
            return False
        last = prepared.messages[-1] if prepared is not None else None
        self._insert_head(db, conversation, last)
        if prepared is not None and last is not None:
            self._insert_prepared(db, cid, prepared, 0)
            self._seen[cid] = (self._version(db), last.seq + 1, last.hash)
        return True

    def _fenced_head(self, db: sqlite3.Connection, cid: str, fence: str | None,
                     lock: str = "") -> tuple[Any, ...]:
        """The lease row's owner and the head row in one query (one row, either side
        absent), checked in the order of the two queries it replaces."""
        if fence is None:
            return self._header(db, cid, lock)
        row = db.execute(FENCED_HEAD, (validate_id(cid),)).fetchone()
        record = dict(zip(("owner", "host", "pid"), row[:3], strict=True)) \
            if row[0] is not None else None  # (owner is NOT NULL in a lease row)
        check_fence(self._shown(), cid, fence, record)
        if row[3] is None:
            raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
        return tuple(row[3:])

    def _write(self, action: str) -> AbstractContextManager[sqlite3.Connection]:
        return self._tx(action)

    @contextmanager
    def _snapshot(self, action: str) -> Iterator[sqlite3.Connection]:
        with self._reading() as db:
            try:
                db.execute("BEGIN")
                yield db
            finally:
                if db.in_transaction:  # even when Ctrl-C struck just after BEGIN
                    db.execute("COMMIT")

    @contextmanager
    def _load_snapshot(self) -> Iterator[sqlite3.Connection]:
        """A load's snapshot, the database file memory-mapped while it is read (WAL on a
        local disk only): the pages of a long conversation are then read without a
        system call each (512-byte pages: a 100,000-message chain is 200,000 of them).
        SQLite maps for reading only; every write still goes through its usual calls."""
        mapped = self.journal_mode == "wal" and not self.read_only_reason
        with self._reading() as db:
            if mapped:
                db.execute(f"PRAGMA mmap_size={LOAD_MMAP}")
            try:
                with self._snapshot("read") as inner:
                    yield inner
            finally:
                if mapped:
                    db.execute("PRAGMA mmap_size=0")

    def _rows(self, db: sqlite3.Connection, cid: str) -> list[Any]:
        """(seq, body bytes, hash) of every message row, in seq order. ``MESSAGE_BODY``
        looks each body up in long_bodies when it is the mark: a conversation with no
        long body (most) is read without that test per row (a sixth of the fetch)."""
        if db.execute("SELECT 1 FROM long_bodies WHERE conversation_id=? LIMIT 1",
                      (cid,)).fetchone() is not None:
            return super()._rows(db, cid)
        return db.execute("SELECT seq, CAST(body AS BLOB), hash FROM messages WHERE "
                          "conversation_id=? ORDER BY seq", (cid,)).fetchall()

    def sealed_rows(self, conversation_id: str, take: Take
                    ) -> tuple[tuple[Any, ...], tuple[int, bytes] | None] | None:
        """For the encrypted store's load with the key (``sealed``): every message row in
        seq order, a binary row as stored, handed to ``take`` a chunk at a time
        (``ROWS_PER_TAKE``) as its sealed bytes and clear fields (``unpacked``), then the
        head row and the partial row, all read in one snapshot; the seqs are checked to
        be 0 .. n-1 by the index (not fetched), and the last row's hash to be the head
        row's. None when a row must be read otherwise (a long body, a text row), the seqs
        or the last hash do not fit (the caller's verified path, ``stored_rows``, then
        names what is wrong) or ``take`` said stop."""
        from chatstate.stores.codec import ROWS_PER_TAKE, unpacked  # encrypted stores only

        cid = conversation_id
        with self._load_snapshot() as db:
            head = self._header(db, cid)
            if db.execute("SELECT 1 FROM long_bodies WHERE conversation_id=? LIMIT 1",
                          (cid,)).fetchone() is not None:
                return None
            low, high, last = db.execute(
                "SELECT (SELECT min(seq) FROM messages WHERE conversation_id=?1), "
                "(SELECT max(seq) FROM messages WHERE conversation_id=?1), "
                "(SELECT hash FROM messages WHERE conversation_id=?1 ORDER BY seq DESC "
                "LIMIT 1)", (cid,)).fetchone()
            if last != head[6] or (head[5] and (low != 0 or high != head[5] - 1)):
                return None
            count = 0
            rows = db.execute("SELECT CAST(body AS BLOB) FROM messages WHERE "
                              "conversation_id=? ORDER BY seq", (cid,))
            while chunk := rows.fetchmany(ROWS_PER_TAKE):
                count += len(chunk)
                split = unpacked([row[0] for row in chunk])
                if split is None or not take(*split):
                    return None
            partial = self._partial_row(db, cid)
        if count != head[5]:
            return None  # (seq is the primary key's: n distinct from 0 to n - 1 is 0 .. n-1)
        return head, partial

    def _where(self, cid: str) -> str:
        return f"{self.path} conversation {cid!r}"

    def _shown(self) -> str:
        return str(self.path)

    def _version(self, db: sqlite3.Connection) -> int:
        """``PRAGMA data_version``: it moves when another connection commits (inside a
        write, read once per commit group: ``_group_version``)."""
        version = self._group_version()
        if version is not None:
            return version
        return int(db.execute("PRAGMA data_version").fetchone()[0])

    def _held_blob_sizes(self, db: sqlite3.Connection, digests: list[str]) -> dict[str, int]:
        return self._blob_sizes(digests)

    def _insert_messages(self, db: sqlite3.Connection, cid: str,
                         fresh: Sequence[Message], bodies: Sequence[str]) -> None:
        try:
            db.executemany("INSERT INTO messages (conversation_id, seq, body, hash) "
                           "VALUES (?, ?, ?, ?)", [(cid, m.seq, _row(m, body), m.hash)
                                                   for m, body in zip(fresh, bodies, strict=True)])
        except sqlite3.IntegrityError:
            raise ConflictError(f"{self._where(cid)}: another writer took seq {fresh[0].seq}; "
                                "reload and retry") from None

    # -- long bodies, in pieces ---------------------------------------------------------
    # sqlite3 copies a bound value (and SQLite copies it again into the row's record), and
    # keeps the copy bound in its statement cache until the statement runs again: a 50 MB
    # reply bound whole cost 150 MB more. A long body (``long_text``) is written a slice
    # at a time into a zeroblob instead, by incremental blob I/O, which needs a rowid
    # table: the partial row (partials), or its row of long_bodies for a message.
    def _partial_body(self, partial: Message) -> str | None:
        if self.writes_pieces and long_text(partial.content):
            return None  # written in pieces under the lock, never built whole
        return partial.body()

    def _put_partial(self, db: sqlite3.Connection, cid: str, partial: Message,
                     body: str | None) -> None:
        if body is not None:  # (None: ``_partial_body`` left a long one to the pieces)
            super()._put_partial(db, cid, partial, body)
            return
        db.execute("INSERT INTO partials (conversation_id, seq, body) VALUES (?, ?, "
                   "zeroblob(?)) ON CONFLICT (conversation_id) DO UPDATE SET "
                   "seq=excluded.seq, body=excluded.body", (cid, partial.seq, _size(partial)))
        rowid = db.execute("SELECT rowid FROM partials WHERE conversation_id=?",
                           (cid,)).fetchone()[0]
        _write_blob(db, "partials", rowid, partial)

    def _insert_prepared(self, db: sqlite3.Connection, cid: str, prepared: PreparedBatch,
                         already: int) -> None:
        rest = range(already, len(prepared.messages))
        self._insert_messages(db, cid, [prepared.messages[i] for i in rest],
                              [LONG_BODY if i in prepared.pieces else prepared.bodies[i]
                               for i in rest])
        for i in rest:
            if i in prepared.pieces:
                msg = prepared.messages[i]
                rowid = db.execute("INSERT INTO long_bodies (conversation_id, seq, body) "
                                   "VALUES (?, ?, zeroblob(?))",
                                   (cid, msg.seq, _size(msg))).lastrowid
                assert rowid is not None  # an INSERT into a rowid table
                _write_blob(db, "long_bodies", rowid, msg)

    def _delete_messages(self, db: sqlite3.Connection, cid: str) -> None:
        super()._delete_messages(db, cid)
        db.execute("DELETE FROM long_bodies WHERE conversation_id=?", (cid,))

    # -- search ----------------------------------------------------------------------
    def search(self, text: str, limit: int = 50) -> list[tuple[str, int, str]]:
        """(conversation id, seq, content) of messages containing ``text``.

        FTS5 (whole words, any case) once the index has caught up with the
        messages appended since the last search; a substring scan where FTS5 is
        missing or the store is read-only.
        """
        if self._fts and not self.read_only_reason:
            self._index_for_search()
            phrase = '"' + text.replace('"', '""') + '"'
            with self._reading() as db:
                rows = db.execute("SELECT conversation_id, seq, content FROM message_text "
                                  "WHERE message_text MATCH ? LIMIT ?", (phrase, limit)).fetchall()
        else:
            with self._reading() as db:
                rows = db.execute(
                    "SELECT conversation_id, seq, json_extract(CAST(" + MESSAGE_BODY +
                    " AS TEXT), '$.content') FROM messages "
                    "WHERE instr(lower(json_extract(CAST(" + MESSAGE_BODY + " AS TEXT), "
                    "'$.content')), lower(?)) > 0 LIMIT ?",
                    (text, limit)).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    def _index_for_search(self) -> None:
        with self._tx("index for search") as db:
            behind = db.execute(
                "SELECT c.id, coalesce(p.indexed, 0) FROM conversations c LEFT JOIN "
                "search_progress p ON p.conversation_id = c.id "
                "WHERE c.message_count > coalesce(p.indexed, 0)").fetchall()
            for cid, indexed in behind:
                db.execute("INSERT INTO message_text (content, conversation_id, seq) "
                           "SELECT json_extract(CAST(" + MESSAGE_BODY + " AS TEXT), "
                           "'$.content'), conversation_id, seq "
                           "FROM messages WHERE conversation_id=? AND seq>=?", (cid, indexed))
                db.execute("INSERT OR REPLACE INTO search_progress VALUES (?, (SELECT "
                           "message_count FROM conversations WHERE id=?))", (cid, cid))

    # -- writes (the rest are the relational core's) -------------------------------
    def delete(self, conversation_id: str) -> None:
        with self._tx("delete from") as db:
            self._header(db, conversation_id)
            if self._fts:
                db.execute("DELETE FROM message_text WHERE conversation_id=?",
                           (conversation_id,))
            db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    def quarantine(self, conversation_id: str) -> str:
        """Dump a (damaged) conversation's raw rows beside the database, then remove them.

        The dump is written and fsynced before the rows are deleted; nothing is lost.
        """
        from chatstate.durable.files import atomic_write

        cid = validate_id(conversation_id)
        qdir = self.path.parent / ".quarantine"
        ensure_dir(qdir)
        target = qdir / f"{self.path.name}-{cid}.{now_iso().replace(':', '')}.json"
        with self._tx("quarantine a conversation in") as db:
            head = db.execute("SELECT * FROM conversations WHERE id=?", (cid,)).fetchone()
            if head is None:
                raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
            rows = [(seq, _text(seq, body), hash_) for seq, body, hash_ in db.execute(
                "SELECT seq, " + MESSAGE_BODY + ", hash FROM messages WHERE "
                "conversation_id=? ORDER BY seq", (cid,)).fetchall()]
            partial = db.execute("SELECT seq, CAST(body AS BLOB) FROM partials WHERE "
                                 "conversation_id=?",
                                 (cid,)).fetchone()
            dump = {"database": str(self.path), "conversation": list(head),
                    "messages": [list(r) for r in rows],
                    "partial": [partial[0], _text(partial[0], partial[1])] if partial
                    else None}
            # ASCII, every other character escaped: the damaged bytes' surrogates included
            atomic_write(target, json.dumps(dump, indent=1).encode())
            if self._fts:
                db.execute("DELETE FROM message_text WHERE conversation_id=?", (cid,))
            db.execute("DELETE FROM conversations WHERE id=?", (cid,))
        return str(target)

    def leftovers(self, conversation_ids: Sequence[str],
                  counts: Mapping[str, int]) -> list[str]:
        """A rollback journal, or a write lock still held (ReportsLeftovers)."""
        from chatstate.stores.sqlite._leftovers import sqlite_leftovers

        return sqlite_leftovers(self.path)
