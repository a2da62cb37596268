"""The sqlite store's connection: open, configure, migrate, transactions, read-only fallback.

One connection per store, shared by the threads of its caller (AsyncChat runs
turns in worker threads), so every use holds ``_lock``. WAL with
synchronous=FULL; a rollback journal with synchronous=EXTRA on network
filesystems, where WAL is unsafe. On a full or read-only disk, where SQLite
cannot even create its -shm file, the database is opened immutable and
read-only (when no WAL data is pending), so what is stored stays readable and
every write says why it cannot happen.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import quote

from ..errors import ChatstateError, StoreUnavailable
from ..uninterruptible import uninterruptible
from ._files import ensure_dir
from ._sqlite_errors import AT_COMMIT, translate
from ._sqlite_schema import APPLICATION_ID, MIGRATIONS, PAGE_SIZE
from .sqlite_setup import check_owner, check_version, configure, migrate

STORE_WHAT = "chatstate store"
STORE_FIX = "Point the store at another file."


class SqliteConnection:
    busy_timeout_ms = 10_000

    def __init__(self, path: Path, url: str) -> None:
        self.path = path
        self.url = url
        self.recovery: list[str] = []
        self.journal_mode = "wal"
        self.read_only_reason: str | None = None
        self._db: sqlite3.Connection | None = None
        self._lock = threading.RLock()
        self._fts = False

    def open(self) -> None:
        from ..durability import inspect

        ensure_dir(self.path.parent)
        with translate(self.path, "create"):
            if not self.path.exists():  # create it 0600 before SQLite does, whatever the umask
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        network = inspect(self.path, probe=False).network_fs
        try:
            self._db = self._connect(network, read_only=False)
        except StoreUnavailable as exc:
            # A full disk or a read-only mount: what is stored must still be readable.
            self._db = self._open_read_only(exc)

    def _connect(self, network: bool, *, read_only: bool) -> sqlite3.Connection:
        target = (f"file:{quote(str(self.path))}?mode=ro&immutable=1" if read_only
                  else str(self.path))
        with translate(self.path, "open"):
            db = sqlite3.connect(target, timeout=self.busy_timeout_ms / 1000, uri=read_only,
                                 isolation_level=None, check_same_thread=False)
        try:
            self._configure(db, network, read_only=read_only)
        except BaseException:
            db.close()
            raise
        return db

    def _open_read_only(self, cause: StoreUnavailable) -> sqlite3.Connection:
        """Open without writing anything (no -shm, no migration) when writing is impossible.

        Only safe when no write-ahead log holds committed data that the main file lacks.
        """
        wal = self.path.with_name(self.path.name + "-wal")
        if (wal.exists() and wal.stat().st_size > 0) or self.path.stat().st_size == 0:
            raise cause
        db = self._connect(False, read_only=True)
        self.read_only_reason = str(cause)
        self.recovery.append(f"opened read-only, writes will fail: {cause}")
        return db

    def _configure(self, db: sqlite3.Connection, network: bool, *, read_only: bool) -> None:
        check_owner(db, self.path, APPLICATION_ID, STORE_WHAT, STORE_FIX)
        if read_only:
            with translate(self.path, "read"):
                check_version(db.execute("PRAGMA user_version").fetchone()[0],
                              len(MIGRATIONS), self.path, STORE_WHAT)
                self._fts = bool(db.execute(
                    "SELECT 1 FROM sqlite_master WHERE name='message_text'").fetchone())
            return
        with translate(self.path, "configure"):
            # only now that the file is known to be ours (a foreign file keeps its mode);
            # -wal and -shm copy the database file's mode when SQLite creates them
            for path in (self.path, *(self.path.with_name(self.path.name + suffix)
                                      for suffix in ("-wal", "-shm"))):
                with suppress(FileNotFoundError):
                    if os.stat(path).st_mode & 0o777 != 0o600:
                        os.chmod(path, 0o600)
        self.journal_mode = configure(db, self.path, network=network,
                                      busy_timeout_ms=self.busy_timeout_ms,
                                      page_size=PAGE_SIZE)
        with translate(self.path, "configure"):
            if network:
                self.recovery.append(f"{self.path} is on a network filesystem: WAL is unsafe "
                                     "there, using a rollback journal with synchronous=EXTRA")
            db.execute("PRAGMA foreign_keys=ON")
            if db.execute("PRAGMA user_version").fetchone()[0] != len(MIGRATIONS):
                self._migrate(db)  # an up-to-date store opens without a write
            self._fts = bool(db.execute(
                "SELECT 1 FROM sqlite_master WHERE name='message_text'").fetchone())

    def _migrate(self, db: sqlite3.Connection) -> None:
        try:
            db.execute("BEGIN IMMEDIATE")
            with uninterruptible():
                migrate(db, self.path, MIGRATIONS, APPLICATION_ID, STORE_WHAT, STORE_FIX)
                db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise ChatstateError(f"store {self.url} is not open: use chatstate.open_store()")
        return self._db

    @contextmanager
    def _tx(self, action: str) -> Iterator[sqlite3.Connection]:
        """One write transaction; COMMIT returns only when durable (synchronous=FULL)."""
        if self.read_only_reason:
            raise StoreUnavailable(f"could not {action} {self.path}: the store was opened "
                                   f"read-only because {self.read_only_reason}")
        with self._lock, translate(self.path, action):
            db = self.db
            try:
                db.execute("BEGIN IMMEDIATE")  # Ctrl-C still works while it waits for a lock
                with uninterruptible():  # from here to COMMIT, not (it would leave BEGIN open)
                    yield db
                    with translate(self.path, action, outcome=AT_COMMIT):
                        db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    # the original error says more; SQLite rolls back on its own
                    with suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The one connection, for a read (it is shared by threads, so one at a time)."""
        with self._lock, translate(self.path, "read"):
            yield self.db

