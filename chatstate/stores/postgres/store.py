"""The postgresql store: one row per message on a PostgreSQL server, for fleets.

``postgresql://user@host:5432/db?schema=chatstate``. Compare-and-append is one
transaction that locks the conversation's head row (``FOR UPDATE``: last seq and
hash), checks the new messages chain from it, inserts them under the primary key
``(conversation_id, seq)`` and moves the head; two writers on two hosts cannot
both win. A partial reply is an upsert. The durability guard asks the server how
it acknowledges commits (see ``_guard``). The logic is the relational core's
(``stores._relational``), shared with sqlite. A chain is verified in full the
first time this process writes to it and whenever its head moved under it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from chatstate.core.transcript import Conversation, Message, validate_id
from chatstate.errors import ConversationNotFound
from chatstate.stores._relational import Dialect, RelationalStore
from chatstate.stores.leases import Holder, Lease
from chatstate.stores.postgres._base import PgBase
from chatstate.stores.postgres._conn import PgTarget
from chatstate.stores.postgres._lease import PgLease


class PostgresStore(PgLease, PgBase, RelationalStore):
    """Conversations in a PostgreSQL schema. See the module docstring."""

    dialect = Dialect(mark="%s", for_update=" FOR UPDATE", for_share=" FOR SHARE")

    def __init__(self, target: PgTarget, url: str) -> None:
        super().__init__(target, url)
        self._seen = {}

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        return cls(PgTarget(url), url)

    # -- the relational core's hooks ---------------------------------------------------
    def _try_create_leased(self, lease: Lease, conversation: Conversation,
                           messages: list[Message]) -> Holder | None:
        return self._create_leased_once(lease, conversation, messages)  # one transaction

    def _write(self, action: str) -> AbstractContextManager[Any]:
        return self._tx(action)

    def _snapshot(self, action: str) -> AbstractContextManager[Any]:
        return self._tx(action, read_only=True)  # REPEATABLE READ: one snapshot

    def _where(self, cid: str) -> str:
        return f"{self.url} conversation {cid!r}"

    def _shown(self) -> str:
        return self.target.shown

    def _scrub(self, text: str) -> str:
        return self.target.scrub(text)

    def _held_blob_sizes(self, db: Any, digests: list[str]) -> dict[str, int]:
        return self._blob_sizes(digests, db)

    def _insert_messages(self, db: Any, cid: str, fresh: Sequence[Message],
                         bodies: Sequence[str]) -> None:
        # a seq another writer took first is a UniqueViolation: ConflictError (_errors)
        with db.cursor() as cur:
            cur.executemany("INSERT INTO messages (conversation_id, seq, body, hash, "
                            "search_text) VALUES (%s, %s, %s, %s, %s)",
                            [(cid, m.seq, body, m.hash, _searchable(m))
                             for m, body in zip(fresh, bodies, strict=True)])

    # -- search ----------------------------------------------------------------------
    def search(self, text: str, limit: int = 50) -> list[tuple[str, int, str]]:
        """(conversation id, seq, content) of messages holding ``text`` as a phrase of
        whole words, any case (PostgreSQL full-text search, 'simple' configuration)."""
        with self._tx("search", read_only=True) as db:
            rows = db.execute(
                "SELECT conversation_id, seq, search_text FROM messages WHERE "
                "to_tsvector('simple', search_text) @@ phraseto_tsquery('simple', %s) "
                "ORDER BY conversation_id, seq LIMIT %s", (text, limit)).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    # -- writes (the rest are the relational core's) -------------------------------
    def delete(self, conversation_id: str) -> None:
        with self._tx("delete from") as db:
            self._header(db, conversation_id, self.dialect.for_update)
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
