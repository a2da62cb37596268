"""The relational core's reads: a conversation's rows in one snapshot, decoded and
verified outside it; the rows as stored, for the encrypted store's fast load."""

from __future__ import annotations

import json
from typing import Any

from chatstate._gcpause import paused
from chatstate.core.canonical import chain_hash
from chatstate.core.transcript import (
    Conversation,
    ConversationSummary,
    Message,
    validate_id,
)
from chatstate.errors import (
    ConversationNotFound,
    CorruptTranscriptError,
)
from chatstate.stores._relational._base import HEAD, RelationalBase, _raw
from chatstate.stores._rows import decode_rows, row_message, row_text
from chatstate.stores.blobs import check_stored_blobs, named_blobs


class RelationalReads(RelationalBase):
    """Loads, the rows as stored, listings, blob sizes (``RelationalBase``'s hooks)."""

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
