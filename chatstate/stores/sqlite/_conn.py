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
import time
from collections.abc import Generator, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from urllib.parse import quote

from chatstate.durable.files import ensure_dir
from chatstate.durable.migrations import pending, run
from chatstate.durable.sqlite_errors import AT_COMMIT, translate
from chatstate.durable.sqlite_setup import SqliteBackend, check_owner, configure
from chatstate.durable.uninterruptible import uninterruptible
from chatstate.errors import ChatstateError, ConfigurationError, StoreUnavailable
from chatstate.stores.sqlite._schema import APPLICATION_ID, MIGRATIONS, PAGE_SIZE

STORE_WHAT = "chatstate store"
STORE_FIX = "Point the store at another file."


GROUP_MAX = 64  # writes committed together at most (bounds the first one's wait)
GROUP_WAIT_MIN = 0.001  # a queued writer is worth this much wait even on the fastest disk


class _Group:
    """Writes sharing one open transaction, and how their commit ended."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.members = 0
        self.opened = time.monotonic()
        self.committer: int | None = None
        self.error: BaseException | None = None
        self.version: int | None = None
        """``PRAGMA data_version`` as read inside this group's transaction: it holds the
        write lock from BEGIN IMMEDIATE to COMMIT, so no other connection can commit
        meanwhile and the number cannot move (read once, not once per member)."""
        # members wait on this, not on the connection's lock: a member woken by the
        # commit must not compete with the writers queued for the next group
        self.settled = threading.Event()

    def finish(self, error: BaseException | None) -> None:
        self.error = error
        self.settled.set()


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
        self._queue_lock = threading.Lock()
        self._queued = 0  # writers waiting for the connection, who will join the group
        self._group: _Group | None = None  # writes done, not yet committed
        self._writing: int | None = None  # the thread inside a write's block
        self._commit_cost = 0.002  # seconds a COMMIT takes (moving average)
        self._fts = False

    def open(self) -> None:
        from chatstate.durable.guard import inspect

        ensure_dir(self.path.parent)
        if self.path.is_dir():  # SQLite would say "disk I/O error": check the disk, it is fine
            raise ConfigurationError(f"{self.path} is a directory, and a sqlite store is a "
                                     f"file: name a file, e.g. sqlite://{self.path}/chatstate.db")
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
        # one leading slash: "file://x" would make x the URI's authority (sqlite:////abs paths)
        uri_path = "/" + str(self.path).lstrip("/") if self.path.is_absolute() else str(self.path)
        target = (f"file:{quote(uri_path)}?mode=ro&immutable=1" if read_only
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
        self.read_only_reason = unwritable(self.path) or str(cause)
        self.recovery.append(f"opened read-only (reading works, writes will fail): "
                             f"{self.read_only_reason}")
        return db

    def _configure(self, db: sqlite3.Connection, network: bool, *, read_only: bool) -> None:
        check_owner(db, self.path, APPLICATION_ID, STORE_WHAT, STORE_FIX)
        if read_only:
            with translate(self.path, "read"):
                pending(MIGRATIONS, db.execute("PRAGMA user_version").fetchone()[0],
                        str(self.path), STORE_WHAT)  # a newer store is refused here too
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
            # an up-to-date store opens without a write
            run(SqliteBackend.on(db, self.path, APPLICATION_ID, STORE_WHAT, STORE_FIX),
                MIGRATIONS)
            self._fts = bool(db.execute(
                "SELECT 1 FROM sqlite_master WHERE name='message_text'").fetchone())

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise ConfigurationError(f"store {self.url} is not open: use chatstate.open_store()")
        return self._db

    @contextmanager
    def _tx(self, action: str) -> Iterator[sqlite3.Connection]:
        """One write, returned from only once COMMIT made it durable (synchronous=FULL).

        Group commit: writes from threads that queue up while one is in progress join
        its open transaction, each in a savepoint of its own (a failed one is rolled
        back to it alone; one that succeeded is left open, and the group's COMMIT
        releases them all), and the last in the queue commits them all with one fsync;
        the others wait for it, at most about as long as a commit takes (on a fast disk
        groups stay small).
        Alone, a write is BEGIN IMMEDIATE ... COMMIT as before. From BEGIN until the
        commit is settled Ctrl-C is held back (see ``uninterruptible``). Never call it
        with the connection lock already held (inside ``_reading`` or another
        ``_tx``): a member waits for its commit after releasing the lock, and a
        lock still held would keep out the writer who is to commit.
        """
        if self.read_only_reason:
            raise StoreUnavailable(f"could not {action} {self.path}: the store was opened "
                                   f"read-only because {self.read_only_reason}")
        with ExitStack() as held:  # leaving it delivers a held-back Ctrl-C, lock released
            with self._queue_lock:
                self._queued += 1
            try:
                self._lock.acquire()
            finally:
                with self._queue_lock:
                    self._queued -= 1
            ended = False
            try:
                with translate(self.path, action):
                    group = yield from self._joined(action, held)
                ended = True
                self._settle()
            finally:
                if not ended:
                    self._settle()  # a failed write still commits the writes waiting on it
                self._lock.release()
            group.settled.wait()  # by the last writer to join, who holds the lock
            if group.error is not None and group.committer != threading.get_ident():
                raise StoreUnavailable(
                    f"could not {action} {self.path}: it shared a commit with other "
                    f"writes, and {group.error}") from group.error
            if group.error is not None:
                raise group.error

    def _joined(self, action: str, held: ExitStack
                ) -> Generator[sqlite3.Connection, None, _Group]:
        """Run the caller's block inside the open group (opening one if none is)."""
        db = self.db
        mine = shared = False  # whether this write has begun; in a savepoint of its own
        try:
            if self._group is None:
                db.execute("BEGIN IMMEDIATE")  # Ctrl-C still works while it waits for a lock
            held.enter_context(uninterruptible())
            if self._group is None:
                self._group = _Group(action)
            group = self._group
            shared = group.members > 0
            if shared:  # one name for all: ROLLBACK TO and RELEASE take the latest of
                # that name, this member's, and leave the earlier members' (one cached
                # statement, not one per member)
                db.execute("SAVEPOINT chatstate_write")
            mine = True
            self._writing = threading.get_ident()
            try:
                yield db
            finally:
                self._writing = None
            # (no RELEASE: the savepoint stays open until the group's COMMIT ends them all)
            group.members += 1
        except BaseException as exc:
            self._undo(db, exc, mine=mine, shared=shared)
            raise
        return group

    def _group_version(self) -> int | None:
        """``PRAGMA data_version`` for a write inside the open group (read once per
        group, see ``_Group.version``); None outside one."""
        group = self._group
        if group is None or self._writing != threading.get_ident():
            return None
        if group.version is None:
            group.version = int(self.db.execute("PRAGMA data_version").fetchone()[0])
        return group.version

    def _undo(self, db: sqlite3.Connection, exc: BaseException, *, mine: bool,
              shared: bool) -> None:
        """Take back the failed write alone; if that cannot be done (SQLite ended the
        whole transaction), the group's other writes failed with it."""
        group = self._group
        if group is None:  # Ctrl-C just after BEGIN
            if db.in_transaction:
                with suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            return
        if not mine:
            return
        if shared and db.in_transaction:
            try:  # the latest savepoint of the name: this member's
                db.execute("ROLLBACK TO chatstate_write")
                db.execute("RELEASE chatstate_write")
                return
            except sqlite3.Error as undo:
                exc = undo
        if db.in_transaction:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")  # the original error says more
        self._group = None
        group.finish(exc if group.members else None)

    def _settle(self, *, flush: bool = False) -> None:
        """Commit the open group unless more writers are queued to join it (or ``flush``).

        Never raises for the commit: the group's writers raise its error themselves."""
        group = self._group
        if group is None:
            return
        waited = time.monotonic() - group.opened
        if not (flush or self._queued == 0 or group.members >= GROUP_MAX
                or waited >= max(self._commit_cost, GROUP_WAIT_MIN)):
            return
        self._group = None
        group.committer = threading.get_ident()
        with uninterruptible():  # members must hear how it ended, whatever happens
            try:
                with translate(self.path, group.action, outcome=AT_COMMIT):
                    started = time.monotonic()
                    self.db.execute("COMMIT")
                    # waiting longer for company than a commit costs would not pay
                    self._commit_cost += (time.monotonic() - started - self._commit_cost) / 8
            except ChatstateError as exc:
                if self._db is not None and self._db.in_transaction:
                    with suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                group.finish(exc)
            else:
                group.finish(None)

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The one connection, for a read (it is shared by threads, so one at a time)."""
        with self._lock, translate(self.path, "read"):
            if self._writing != threading.get_ident():
                self._settle(flush=True)  # what is read is what is durable
            yield self.db


def unwritable(path: Path) -> str | None:
    """Why SQLite cannot write beside ``path`` (it needs the directory for -wal and -shm)."""
    folder = path.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return (f"{folder} is on a file system mounted read-only; remount it read-write "
                    "to write to the store")
    except OSError:
        return None
    for where in (path, folder):
        if not os.access(where, os.W_OK):
            return (f"{where} is not writable by this user; fix its permissions (SQLite also "
                    "writes -wal and -shm files beside the database) to write to the store")
    return None
