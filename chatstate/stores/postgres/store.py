"""The postgresql store: one row per message on a PostgreSQL server, for fleets.

``postgresql://user@host:5432/db?schema=chatstate``. Compare-and-append is one
transaction that locks the conversation's head row (``FOR UPDATE``: last seq and
hash), checks the new messages chain from it, inserts them under the primary key
``(conversation_id, seq)`` and moves the head; two writers on two hosts cannot
both win. A partial reply is an upsert. The durability guard asks the server how
it acknowledges commits (see ``_pg_guard``). A chain is verified in full the
first time this process writes to it and whenever its head moved under it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from chatstate.core.transcript import (
    Conversation,
    ConversationSummary,
    Message,
    chain_hash,
    now_iso,
    validate_id,
)
from chatstate.errors import ConflictError, ConversationNotFound, CorruptTranscriptError
from chatstate.stores.base import (
    check_append,
    check_partial_commit,
    check_stored_blobs,
    named_blobs,
    refuse_unheld_blobs,
)
from chatstate.stores.postgres._base import PgBase
from chatstate.stores.postgres._conn import PgTarget
from chatstate.stores.postgres._lease import PgLease
from chatstate.stores.sqlite._rows import decode_rows, row_message

HEAD = ("SELECT id, title, created_at, updated_at, metadata, message_count, last_hash "
        "FROM conversations WHERE id=%s")


class PostgresStore(PgLease, PgBase):
    """Conversations in a PostgreSQL schema. See the module docstring."""

    def __init__(self, target: PgTarget, url: str) -> None:
        super().__init__(target, url)
        self._seen: dict[str, tuple[int, str | None]] = {}

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        return cls(PgTarget(url), url)

    def _where(self, cid: str) -> str:
        return f"{self.url} conversation {cid!r}"

    # -- reads -----------------------------------------------------------------------
    def _header(self, db: Any, cid: str, lock: str = "") -> tuple[Any, ...]:
        row = db.execute(HEAD + lock, (validate_id(cid),)).fetchone()
        if row is None:
            raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
        return tuple(row)

    def _chain(self, db: Any, cid: str, head: tuple[Any, ...]) -> list[Message]:
        where = self._where(cid)
        rows = db.execute("SELECT seq, body, hash FROM messages WHERE conversation_id=%s "
                          "ORDER BY seq", (cid,)).fetchall()
        messages = decode_rows([(s, b.encode(), h) for s, b, h in rows], where)
        if len(messages) != head[5] or (messages[-1].hash if messages else None) != head[6]:
            position = min(head[5], len(messages))
            raise CorruptTranscriptError(
                f"{where}: the conversation row records {head[5]} messages but {len(messages)} "
                f"are stored (cut off or added by hand from seq {position}); the database "
                "was left as it is", where=where, position=position)
        self._seen[cid] = (head[5], head[6])
        return messages

    def load(self, conversation_id: str) -> Conversation:
        cid = conversation_id
        with self._tx("read", read_only=True) as db:
            head = self._header(db, cid)
            messages = self._chain(db, cid, head)
            prow = db.execute("SELECT seq, body FROM partials WHERE conversation_id=%s",
                              (cid,)).fetchone()
            partial = None
            if prow is not None and prow[0] == len(messages):
                prev = messages[-1].hash if messages else None
                partial = row_message(prow[1], chain_hash(prev, prow[1]), self._where(cid),
                                      prow[0])
            named = [*messages, *([partial] if partial else [])]
            sizes = self._blob_sizes(list(named_blobs(named)), db)
        check_stored_blobs(self._where(cid), named, sizes.get, self._blob_where)
        return Conversation.model_construct(
            id=head[0], title=head[1], created_at=head[2], updated_at=head[3],
            metadata=json.loads(head[4]), messages=messages, partial=partial)

    def list_conversations(self, limit: int | None = None) -> list[ConversationSummary]:
        with self._tx("list", read_only=True) as db:
            rows = db.execute("SELECT id, title, created_at, updated_at, message_count FROM "
                              "conversations ORDER BY updated_at DESC LIMIT %s",
                              (limit,)).fetchall()
        return [ConversationSummary(id=r[0], title=r[1], created_at=r[2], updated_at=r[3],
                                    message_count=r[4]) for r in rows]

    def search(self, text: str, limit: int = 50) -> list[tuple[str, int, str]]:
        """(conversation id, seq, content) of messages holding ``text`` as a phrase of
        whole words, any case (PostgreSQL full-text search, 'simple' configuration)."""
        with self._tx("search", read_only=True) as db:
            rows = db.execute(
                "SELECT conversation_id, seq, search_text FROM messages WHERE "
                "to_tsvector('simple', search_text) @@ phraseto_tsquery('simple', %s) "
                "ORDER BY conversation_id, seq LIMIT %s", (text, limit)).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    # -- writes ----------------------------------------------------------------------
    def _verified_count(self, db: Any, cid: str, lock: str) -> int:
        """The head (locked), once the chain verifies: never write onto damage."""
        head = self._header(db, cid, lock)
        if self._seen.get(cid) != (head[5], head[6]):
            self._chain(db, cid, head)
        return int(head[5])

    def create(self, conversation: Conversation) -> None:
        cid = validate_id(conversation.id)
        with self._tx("create a conversation in") as db:
            row = db.execute("INSERT INTO conversations (id, title, created_at, updated_at, "
                             "metadata) VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING "
                             "RETURNING 1", (cid, conversation.title, conversation.created_at,
                                             conversation.updated_at,
                                             json.dumps(conversation.metadata))).fetchone()
        if row is None:
            raise ConflictError(f"conversation {cid!r} already exists in {self.url}")

    def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        cid = conversation_id
        where = self._where(cid)
        with self._tx("append to") as db:
            count = self._verified_count(db, cid, " FOR UPDATE")

            def hash_at(seq: int) -> str:
                row = db.execute("SELECT hash FROM messages WHERE conversation_id=%s AND "
                                 "seq=%s", (cid, seq)).fetchone()
                return str(row[0]) if row else ""

            fresh = messages[check_append(where, count - 1, hash_at, messages):]
            if not fresh:
                return
            named = list(named_blobs(fresh))
            if named:
                sizes = self._blob_sizes(named, db)
                refuse_unheld_blobs(where, fresh, sizes.get)
            if fresh[0].status == "partial":
                row = db.execute("SELECT seq, body FROM partials WHERE conversation_id=%s",
                                 (cid,)).fetchone()
                if row is not None:
                    prev = hash_at(row[0] - 1) if row[0] > 0 else None
                    held = row_message(row[1], chain_hash(prev, row[1]), where, row[0])
                    check_partial_commit(where, fresh, held)
            with db.cursor() as cur:
                cur.executemany("INSERT INTO messages (conversation_id, seq, body, hash, "
                                "search_text) VALUES (%s, %s, %s, %s, %s)",
                                [(cid, m.seq, m.body(), m.hash, _searchable(m)) for m in fresh])
            db.execute("UPDATE conversations SET message_count=%s, last_hash=%s, updated_at=%s "
                       "WHERE id=%s", (fresh[-1].seq + 1, fresh[-1].hash, now_iso(), cid))
            db.execute("DELETE FROM partials WHERE conversation_id=%s AND seq<=%s",
                       (cid, fresh[-1].seq))
        self._seen[cid] = (fresh[-1].seq + 1, fresh[-1].hash)

    def save_partial(self, conversation_id: str, partial: Message) -> None:
        cid = conversation_id
        with self._tx("save the partial reply in") as db:
            count = self._verified_count(db, cid, " FOR SHARE")
            if partial.seq != count:
                raise ConflictError(f"{self._where(cid)}: partial reply for seq {partial.seq}, "
                                    f"but the next seq is {count}",
                                    expected_seq=partial.seq - 1, actual_seq=count - 1)
            db.execute("INSERT INTO partials (conversation_id, seq, body) VALUES (%s, %s, %s) "
                       "ON CONFLICT (conversation_id) DO UPDATE SET seq=excluded.seq, "
                       "body=excluded.body", (cid, partial.seq, partial.body()))

    def clear_partial(self, conversation_id: str) -> None:
        with self._tx("clear the partial reply in") as db:
            db.execute("DELETE FROM partials WHERE conversation_id=%s",
                       (validate_id(conversation_id),))

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None) -> None:
        cid = conversation_id
        with self._tx("update") as db:
            self._verified_count(db, cid, " FOR UPDATE")
            db.execute("UPDATE conversations SET title=coalesce(%s, title), "
                       "metadata=coalesce(%s, metadata), updated_at=%s WHERE id=%s",
                       (title, None if metadata is None else json.dumps(metadata), now_iso(),
                        cid))

    def delete(self, conversation_id: str) -> None:
        with self._tx("delete from") as db:
            self._header(db, conversation_id, " FOR UPDATE")
            db.execute("DELETE FROM conversations WHERE id=%s", (conversation_id,))
        self._seen.pop(conversation_id, None)

    def quarantine(self, conversation_id: str) -> str:
        """Move a (damaged) conversation's raw rows into the ``quarantine`` table, as JSON.

        One transaction: the dump is committed with the removal, so nothing is lost.
        """
        cid = validate_id(conversation_id)
        with self._tx("quarantine a conversation in") as db:
            head = db.execute("SELECT * FROM conversations WHERE id=%s FOR UPDATE",
                              (cid,)).fetchone()
            if head is None:
                raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
            rows = db.execute("SELECT seq, body, hash FROM messages WHERE conversation_id=%s "
                              "ORDER BY seq", (cid,)).fetchall()
            partial = db.execute("SELECT seq, body FROM partials WHERE conversation_id=%s",
                                 (cid,)).fetchone()
            dump = {"conversation": list(head), "messages": [list(r) for r in rows],
                    "partial": list(partial) if partial else None}
            qid = db.execute("INSERT INTO quarantine (conversation_id, dump) VALUES (%s, %s) "
                             "RETURNING id", (cid, json.dumps(dump, ensure_ascii=False))
                             ).fetchone()[0]
            db.execute("DELETE FROM conversations WHERE id=%s", (cid,))
        self._seen.pop(cid, None)
        return f"{self.url} table {self.target.schema}.quarantine id {qid}"


def _searchable(message: Message) -> str:
    return message.text.replace("\x00", " ")  # PostgreSQL text holds no NUL
