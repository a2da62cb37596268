"""SQLite connection setup, written once for the sqlite store and the batch ledger.

The order is the point: ``check_owner`` runs read-only queries first, so a
database that belongs to something else is refused before any PRAGMA that
writes (``journal_mode=WAL`` rewrites the file header). Only then ``configure``
sets the journal and sync modes, and ``migrate`` applies the append-only list
of named migrations keyed on ``PRAGMA user_version``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from chatstate.durable.uninterruptible import uninterruptible
from chatstate.errors import CorruptTranscriptError, SchemaVersionError
from chatstate.stores.sqlite._errors import translate

__all__ = ["Migration", "check_owner", "check_version", "configure", "migrate", "translate",
           "write_transaction"]

Migration = Callable[[sqlite3.Connection], None]


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


def check_version(version: int, known: int, path: Path, what: str) -> None:
    if version > known:
        raise SchemaVersionError(
            f"{path}: {what} schema version {version} is newer than this chatstate knows "
            f"({known}); upgrade chatstate. The file was not changed.", where=str(path))


def migrate(db: sqlite3.Connection, path: Path, migrations: Sequence[Migration],
            application_id: int, what: str, fix: str) -> None:
    """Apply the migrations not yet applied, in the caller's write transaction.

    The owner is checked again inside the transaction (another process may have
    created the file since), and a schema from a newer chatstate is refused.
    """
    check_owner(db, path, application_id, what, fix)
    version = db.execute("PRAGMA user_version").fetchone()[0]
    check_version(version, len(migrations), path, what)
    for number, migration in enumerate(migrations[version:], start=version + 1):
        migration(db)
        db.execute(f"PRAGMA user_version={number}")
    if db.execute("PRAGMA application_id").fetchone()[0] != application_id:
        db.execute(f"PRAGMA application_id={application_id}")


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
