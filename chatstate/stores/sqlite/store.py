"""The sqlite store: one row per message, WAL, synchronous=FULL.

``PRIMARY KEY (conversation_id, seq)`` is the compare-and-append: two writers
racing for one seq cannot both insert it. Appends run in ``BEGIN IMMEDIATE``
transactions, so they are O(1) at any transcript length and serialised across
processes by SQLite's own locks (with a busy timeout).

WAL needs shared memory that network filesystems do not provide; on nfs/cifs/
sshfs the store falls back to a rollback journal with ``synchronous=EXTRA`` and
says so in ``recovery``. The database file is never opened with plain ``open()``
while a connection is live (that would drop SQLite's POSIX locks).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from chatstate.core.transcript import (
    Conversation,
    ConversationSummary,
    Message,
    chain_hash,
    now_iso,
    validate_id,
)
from chatstate.durable.files import ensure_dir
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationNotFound,
    CorruptTranscriptError,
    StoreUnavailable,
)
from chatstate.stores.base import (
    CheckReport,
    Location,
    check_append,
    check_partial_commit,
    check_stored_blobs,
    local_path,
    named_blobs,
    refuse_unheld_blobs,
)
from chatstate.stores.sqlite._blobs import SqliteBlobs
from chatstate.stores.sqlite._lease import SqliteLease
from chatstate.stores.sqlite._rows import decode_rows, row_message, row_text


class SqliteStore(SqliteLease, SqliteBlobs):
    """Conversations in one SQLite database file. See the module docstring."""

    partial_flush_interval = 0.0

    def __init__(self, path: Path, url: str | None = None) -> None:
        super().__init__(path, url or f"sqlite://{path}")
        self._seen: dict[str, tuple[int, int, str | None]] = {}
        """Per conversation: (data_version, count, last hash) when its chain last verified."""

    @classmethod
    def from_url(cls, url: str) -> SqliteStore:
        return cls(local_path(url, "sqlite:///abs/file.db"), url)

    def location(self) -> Location:
        return Location(url=self.url, path=str(self.path))

    # -- reads -----------------------------------------------------------------------
    def _header(self, db: sqlite3.Connection, cid: str) -> tuple[Any, ...]:
        row = db.execute("SELECT id, title, created_at, updated_at, metadata, message_count, "
                         "last_hash FROM conversations WHERE id=?", (validate_id(cid),)).fetchone()
        if row is None:
            raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
        return tuple(row)

    def load(self, conversation_id: str) -> Conversation:
        cid = conversation_id
        where = f"{self.path} conversation {cid!r}"
        with self._reading() as db:
            try:
                db.execute("BEGIN")  # one snapshot for header, messages and partial
                head = self._header(db, cid)
                messages = self._chain(db, cid, head)
                prow = db.execute("SELECT seq, CAST(body AS BLOB) FROM partials WHERE "
                                  "conversation_id=?", (cid,)).fetchone()
            finally:
                if db.in_transaction:  # even when Ctrl-C struck just after BEGIN
                    db.execute("COMMIT")
        partial = None
        if prow is not None and prow[0] == len(messages):
            prev = messages[-1].hash if messages else None
            text = row_text(prow[1], where, prow[0])
            partial = row_message(text, chain_hash(prev, text), where, prow[0])
        named = [*messages, *([partial] if partial else [])]
        sizes = self._blob_sizes(list(named_blobs(named)))
        check_stored_blobs(where, named, sizes.get, self._blob_where)
        return Conversation.model_construct(
            id=head[0], title=head[1], created_at=head[2], updated_at=head[3],
            metadata=json.loads(head[4]), messages=messages, partial=partial)

    def _chain(self, db: sqlite3.Connection, cid: str, head: tuple[Any, ...]) -> list[Message]:
        """Every stored message, chain verified, and its tail checked against the header row."""
        where = f"{self.path} conversation {cid!r}"
        rows = db.execute("SELECT seq, CAST(body AS BLOB), hash FROM messages WHERE "
                          "conversation_id=? ORDER BY seq", (cid,)).fetchall()
        messages = decode_rows(rows, where)
        if len(messages) != head[5] or (messages[-1].hash if messages else None) != head[6]:
            # the chain cannot see its own tail cut off; the conversation row can
            position = min(head[5], len(messages))
            raise CorruptTranscriptError(
                f"{where}: the conversation row records {head[5]} messages but {len(messages)} "
                f"are stored (cut off or added by hand from seq {position}); the database "
                "was left as it is", where=where, position=position)
        self._seen[cid] = (self._data_version(db), head[5], head[6])
        return messages

    def _verified_count(self, db: sqlite3.Connection, cid: str) -> int:
        """The stored message count, once the chain verifies: never write onto damage.

        The full check is skipped while no other connection has committed since this
        one last verified (``PRAGMA data_version``) and the tail is the one it saw.
        """
        head = self._header(db, cid)
        if self._seen.get(cid) != (self._data_version(db), head[5], head[6]):
            self._chain(db, cid, head)
        return int(head[5])

    @staticmethod
    def _data_version(db: sqlite3.Connection) -> int:
        return int(db.execute("PRAGMA data_version").fetchone()[0])

    def list_conversations(self, limit: int | None = None) -> list[ConversationSummary]:
        with self._reading() as db:
            rows = db.execute(
                "SELECT id, title, created_at, updated_at, message_count FROM conversations "
                "ORDER BY updated_at DESC LIMIT ?", (-1 if limit is None else limit,)).fetchall()
        return [ConversationSummary(id=r[0], title=r[1], created_at=r[2], updated_at=r[3],
                                    message_count=r[4]) for r in rows]

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
                    "SELECT conversation_id, seq, json_extract(body, '$.content') FROM messages "
                    "WHERE instr(lower(json_extract(body, '$.content')), lower(?)) > 0 LIMIT ?",
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
                           "SELECT json_extract(body, '$.content'), conversation_id, seq "
                           "FROM messages WHERE conversation_id=? AND seq>=?", (cid, indexed))
                db.execute("INSERT OR REPLACE INTO search_progress VALUES (?, (SELECT "
                           "message_count FROM conversations WHERE id=?))", (cid, cid))

    # -- writes ----------------------------------------------------------------------
    def create(self, conversation: Conversation) -> None:
        with self._tx("create a conversation in") as db:
            try:
                db.execute("INSERT INTO conversations (id, title, created_at, updated_at, "
                           "metadata) VALUES (?, ?, ?, ?, ?)",
                           (validate_id(conversation.id), conversation.title,
                            conversation.created_at, conversation.updated_at,
                            json.dumps(conversation.metadata)))
            except sqlite3.IntegrityError:
                raise ConflictError(f"conversation {conversation.id!r} already exists in "
                                    f"{self.url}") from None

    def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        cid = conversation_id
        with self._tx("append to") as db:
            count = self._verified_count(db, cid)

            def hash_at(seq: int) -> str:
                row = db.execute("SELECT hash FROM messages WHERE conversation_id=? AND seq=?",
                                 (cid, seq)).fetchone()
                return str(row[0]) if row else ""

            where = f"{self.path} conversation {cid!r}"
            already = check_append(where, count - 1, hash_at, messages)
            fresh = messages[already:]
            if not fresh:
                return
            refuse_unheld_blobs(where, fresh, self._blob_size)
            if fresh[0].status == "partial":
                row = db.execute("SELECT seq, body FROM partials WHERE conversation_id=?",
                                 (cid,)).fetchone()
                if row is not None:
                    prev = hash_at(row[0] - 1) if row[0] > 0 else None
                    held = row_message(row[1], chain_hash(prev, row[1]), where, row[0])
                    check_partial_commit(where, fresh, held)
            try:
                db.executemany("INSERT INTO messages (conversation_id, seq, body, hash) "
                               "VALUES (?, ?, ?, ?)",
                               [(cid, m.seq, m.body(), m.hash) for m in fresh])
            except sqlite3.IntegrityError:
                raise ConflictError(f"{self.path} conversation {cid!r}: another writer took "
                                    f"seq {fresh[0].seq}; reload and retry") from None
            db.execute("UPDATE conversations SET message_count=?, last_hash=?, updated_at=? "
                       "WHERE id=?", (fresh[-1].seq + 1, fresh[-1].hash, now_iso(), cid))
            self._seen[cid] = (self._data_version(db), fresh[-1].seq + 1, fresh[-1].hash)
            db.execute("DELETE FROM partials WHERE conversation_id=? AND seq<=?",
                       (cid, fresh[-1].seq))

    def save_partial(self, conversation_id: str, partial: Message) -> None:
        cid = conversation_id
        with self._tx("save the partial reply in") as db:
            count = self._verified_count(db, cid)
            if partial.seq != count:
                raise ConflictError(f"{self.path} conversation {cid!r}: partial reply for seq "
                                    f"{partial.seq}, but the next seq is {count}",
                                    expected_seq=partial.seq - 1, actual_seq=count - 1)
            db.execute("INSERT OR REPLACE INTO partials (conversation_id, seq, body) "
                       "VALUES (?, ?, ?)", (cid, partial.seq, partial.body()))

    def clear_partial(self, conversation_id: str) -> None:
        with self._tx("clear the partial reply in") as db:
            db.execute("DELETE FROM partials WHERE conversation_id=?",
                       (validate_id(conversation_id),))

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None) -> None:
        with self._tx("update") as db:
            self._verified_count(db, conversation_id)
            if title is not None:
                db.execute("UPDATE conversations SET title=? WHERE id=?",
                           (title, conversation_id))
            if metadata is not None:
                db.execute("UPDATE conversations SET metadata=? WHERE id=?",
                           (json.dumps(metadata), conversation_id))
            db.execute("UPDATE conversations SET updated_at=? WHERE id=?",
                       (now_iso(), conversation_id))

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
            rows = db.execute("SELECT seq, body, hash FROM messages WHERE conversation_id=? "
                              "ORDER BY seq", (cid,)).fetchall()
            partial = db.execute("SELECT seq, body FROM partials WHERE conversation_id=?",
                                 (cid,)).fetchone()
            dump = {"database": str(self.path), "conversation": list(head),
                    "messages": [list(r) for r in rows],
                    "partial": list(partial) if partial else None}
            atomic_write(target, json.dumps(dump, ensure_ascii=False, indent=1).encode())
            if self._fts:
                db.execute("DELETE FROM message_text WHERE conversation_id=?", (cid,))
            db.execute("DELETE FROM conversations WHERE id=?", (cid,))
        return str(target)

    def leftovers(self, conversation_ids: Sequence[str],
                  counts: Mapping[str, int]) -> list[str]:
        """A rollback journal, or a write lock still held (ReportsLeftovers)."""
        from chatstate.stores.sqlite._leftovers import sqlite_leftovers

        return sqlite_leftovers(self.path)

    # -- bookkeeping -----------------------------------------------------------------
    def record_open(self, record: dict[str, Any]) -> None:
        with self._tx("record this open in") as db:
            db.execute("INSERT INTO opens (record) VALUES (?)",
                       (json.dumps(record, sort_keys=True),))

    def opens(self) -> list[dict[str, Any]]:
        with self._reading() as db:
            rows = db.execute("SELECT record FROM opens ORDER BY id").fetchall()
        return [json.loads(r[0]) for r in rows]

    def check(self) -> CheckReport:
        report = CheckReport(ok=False, url=self.url)
        key = f"probe-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            with self._tx("write a probe to") as db:
                db.execute("INSERT INTO probes (id, value) VALUES (?, ?)", (key, "ok"))
            report.steps.append(f"wrote and committed a probe row to {self.path}")
            with self._reading() as db:
                row = db.execute("SELECT value FROM probes WHERE id=?", (key,)).fetchone()
            if row is None or row[0] != "ok":
                raise StoreUnavailable(f"{self.path}: the probe row did not read back")
            report.steps.append("read it back")
            with self._tx("delete a probe from") as db:
                db.execute("DELETE FROM probes WHERE id=?", (key,))
            report.steps.append("deleted it")
            report.ok = True
        except (ChatstateError, sqlite3.Error, OSError) as exc:
            report.error = str(exc)
        return report
