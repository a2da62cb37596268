"""SQLite connection setup, written once for the sqlite store and the batch ledger.

The order is the point: ``check_owner`` runs read-only queries first, so a
database that belongs to something else is refused before any PRAGMA that
writes (``journal_mode=WAL`` rewrites the file header). Only then ``configure``
sets the journal and sync modes, and ``SqliteBackend`` lets the migration
runner (``durable.migrations``) apply the append-only history of named
migrations, counted in ``PRAGMA user_version``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any

from chatstate.durable.migrations import Recorded
from chatstate.durable.sqlite_errors import translate
from chatstate.durable.uninterruptible import uninterruptible
from chatstate.errors import CorruptTranscriptError

__all__ = ["SqliteBackend", "check_owner", "configure", "translate", "write_transaction"]


def check_owner(db: sqlite3.Connection, path: Path, application_id: int, what: str,
                fix: str) -> None:
    """Refuse a non-empty database whose ``application_id`` is not ``application_id``.

    Read-only: nothing has been written when this raises. ``what`` names the kind
    of file ("chatstate store"), ``fix`` says what to do instead.
    """
    with translate(path, "read"):
        # one statement, so one snapshot: read apart, a migration that another process
        # commits in between makes a new store look foreign (id 0, yet tables)
        app_id, tables = db.execute(
            "SELECT (SELECT application_id FROM pragma_application_id), "
            "(SELECT count(*) FROM sqlite_master)").fetchone()
    if app_id != application_id and tables:
        raise CorruptTranscriptError(
            f"{path}: a SQLite database that is not a {what} (application_id {app_id:#x}, "
            f"{tables} schema objects); it was not changed. {fix}", where=str(path))


def configure(db: sqlite3.Connection, path: Path, *, network: bool,
              busy_timeout_ms: int, page_size: int | None = None) -> str:
    """Busy timeout, journal and sync mode; returns the journal mode ("wal" or "delete").

    WAL with synchronous=FULL (a commit fsyncs); on a network filesystem, where
    WAL's shared memory is unsafe, a rollback journal with synchronous=EXTRA.
    ``page_size`` applies to a new, empty file only (WAL fixes it once set).
    Call only after ``check_owner``: these PRAGMAs write.
    """
    with translate(path, "configure"):
        db.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        # Debian's SQLite zero-fills every freed page (compiled SECURE_DELETE), others do
        # not: FAST, the same everywhere, clears freed cells where that costs no I/O. A
        # long partial reply replaced at each save had its old pages written over with
        # zeros first (~25 % of a 50 MB reply's saves). No store promises erasure: a
        # deleted json file's blocks stay on the disk too; encryption at rest does.
        db.execute("PRAGMA secure_delete=FAST")
        if page_size and not db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone():
            db.execute(f"PRAGMA page_size={page_size}")
        if network:
            db.execute("PRAGMA journal_mode=DELETE")
            db.execute("PRAGMA synchronous=EXTRA")
            return "delete"
        _into_wal(db, busy_timeout_ms / 1000)
        db.execute("PRAGMA synchronous=FULL")
        return "wal"


def _into_wal(db: sqlite3.Connection, timeout: float) -> None:
    """``journal_mode=WAL``, waiting out openers that race on a new file.

    The switch needs an exclusive lock, and SQLite answers SQLITE_BUSY at once
    instead of calling the busy handler; the mode persists in the file, so once
    one opener has switched the others find it done.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                return
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            # SQLITE_BUSY's message (sqlite_errorcode is Python 3.11+)
            if "database is locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


class SqliteBackend:
    """The migration runner's SQLite backend: ``PRAGMA user_version`` counts what is applied.

    ``read`` runs a query outside any transaction (the store's connection, or the
    ledger's reader); ``transaction`` opens the write transaction (by default
    ``write_transaction`` on ``db``; the ledger's goes through its group commit).
    Inside it the owner is checked again (another process may have created the
    file since ``check_owner``), and at its end the file is marked as ours.
    """

    def __init__(self, path: Path, application_id: int, what: str, fix: str, *,
                 read: Callable[[str], list[Any]],
                 transaction: Callable[[], AbstractContextManager[sqlite3.Connection]]) -> None:
        self.path, self.application_id, self.fix = path, application_id, fix
        self.where, self.what = str(path), what
        self._read, self._transaction = read, transaction

    @classmethod
    def on(cls, db: sqlite3.Connection, path: Path, application_id: int, what: str,
           fix: str) -> SqliteBackend:
        return cls(path, application_id, what, fix,
                   read=lambda sql: db.execute(sql).fetchall(),
                   transaction=lambda: write_transaction(db))

    def peek(self) -> Recorded | None:
        version, app_id = self._read(_VERSION_AND_OWNER)[0]
        # not yet marked as ours (a new file): only the transaction can tell, and mark it
        return int(version) if app_id == self.application_id else None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._transaction() as db:
            check_owner(db, self.path, self.application_id, self.what, self.fix)
            yield db
            if db.execute("PRAGMA application_id").fetchone()[0] != self.application_id:
                db.execute(f"PRAGMA application_id={self.application_id}")

    def applied(self, db: sqlite3.Connection) -> Recorded:
        return int(db.execute("PRAGMA user_version").fetchone()[0])

    def record(self, db: sqlite3.Connection, position: int, name: str) -> None:
        db.execute(f"PRAGMA user_version={position}")


_VERSION_AND_OWNER = ("SELECT (SELECT user_version FROM pragma_user_version), "
                      "(SELECT application_id FROM pragma_application_id)")


@contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT that Ctrl-C cannot leave open.

    BEGIN sits inside the ``try`` (KeyboardInterrupt may be raised the instant it
    returns), and from BEGIN to COMMIT SIGINT is held back (``uninterruptible``).
    Whatever ends the block early rolls the transaction back and propagates.
    """
    try:
        db.execute("BEGIN IMMEDIATE")
        with uninterruptible():
            yield db
            db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")  # the original error says more
        raise
