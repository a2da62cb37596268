"""The relational core's ground: the SQL dialect, the head row's query, and the hooks
each store supplies (``RelationalBase``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from chatstate.core.transcript import (
    Message,
)
from chatstate.errors import (
    ChatstateError,
)
from chatstate.stores.base import (
    PreparedBatch,
)


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


class RelationalBase(ABC):
    """What the reads and writes stand on: the store's settings, its hooks, the query helper."""

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


def _raw(body: bytes | str) -> bytes:
    return body if isinstance(body, bytes) else body.encode()
