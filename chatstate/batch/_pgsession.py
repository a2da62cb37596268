"""One PostgreSQL session of the batch ledger: connected, checked, migrated, and
reconnected when the server goes away (``PgSession``, the base of ``PgLedger``).

A lost connection (the server restarted, or an admin shutdown) is reconnected
with backoff for up to ``reconnect_for`` seconds; the new session is checked
like the first one, then the statement is run again. Every statement is safe
to run twice: reads trivially, and each write says why at its method
(``PgLedger``). psycopg's errors become chatstate errors here, and nowhere else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from chatstate.batch._pgschema import (
    MIGRATIONS,
    MIGRATIONS_COLUMNS,
    MIGRATIONS_TABLE,
    shown,
    split_schema,
)
from chatstate.durable.migrations import PgBackend, run
from chatstate.durable.uninterruptible import uninterruptible
from chatstate.errors import (
    ChatstateError,
    EphemeralStoreError,
    MissingExtra,
    StoreUnavailable,
)
from chatstate.stores.postgres._conn import first_line

DEFAULT_LEASE = 30.0
DEFAULT_RECONNECT = 60.0
_T = TypeVar("_T")


class PgSession:
    """One autocommit connection to the ledger's database, serialised (thread-safe)."""

    def __init__(self, url: str, *, lease: float = DEFAULT_LEASE,
                 allow_unsafe: bool = False, reconnect_for: float = DEFAULT_RECONNECT) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise MissingExtra("a postgresql:// ledger needs psycopg: pip install "
                               "'chatstate[postgres]'", extra="postgres") from exc
        self._psycopg = psycopg
        self.where = shown(url)
        self.lease_seconds: float | None = lease
        self.reconnect_for = reconnect_for
        self._conninfo, self.schema = split_schema(url)
        self._allow_unsafe = allow_unsafe
        self._lock = threading.Lock()
        with self._translate("connect to"):
            self._db = self._connect()
        try:
            with self._translate("inspect"):
                self._check_server(allow_unsafe)
            self._migrate()
            with self._translate("use"):
                self._db.execute(f"SET search_path TO {self.schema}")
        except BaseException:
            self._db.close()
            raise

    def _connect(self) -> Any:
        return self._psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10)

    def _lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the session is gone (not a statement's own error)."""
        errors = self._psycopg.errors
        return (isinstance(exc, (errors.AdminShutdown, errors.CrashShutdown,
                                 errors.CannotConnectNow))
                or bool(self._db.closed) or bool(self._db.broken))

    def _reconnect(self, give_up: float) -> None:
        """A new session, checked like the first; backoff 0.1 s doubling to 2 s until ``give_up``.

        Raises the last connection error when the server is not back in time, and the
        guard's error when the server that came back is unsafe or read-only.
        """
        delay = 0.1
        self._db.close()
        while True:
            try:
                self._db = self._connect()
                self._check_server(self._allow_unsafe)
                self._db.execute(f"SET search_path TO {self.schema}")
                return
            except self._psycopg.OperationalError:
                self._db.close()
                if time.monotonic() + delay > give_up:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _retrying(self, action: str, run: Callable[[bool], _T]) -> _T:
        """``run(again)`` under the lock; after a lost session, reconnect and run it again.

        ``again`` is True on a re-run: the first run's commit may have applied with its
        acknowledgement lost, and ``run`` may look for that first.
        """
        with self._lock, self._translate(action):
            give_up = time.monotonic() + self.reconnect_for
            again = False
            while True:
                try:
                    return run(again)
                except self._psycopg.OperationalError as exc:
                    if not self._lost(exc) or time.monotonic() >= give_up:
                        raise
                self._reconnect(give_up)
                again = True

    @contextmanager
    def _translate(self, action: str) -> Iterator[None]:
        """psycopg's errors become chatstate errors here, and nowhere else."""
        try:
            yield
        except ChatstateError:
            raise
        except self._psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"could not {action} the batch ledger {self.where}: {first_line(exc)}. Check "
                "that the server runs and the URL, PGPASSWORD or ~/.pgpass are right.") from exc
        except self._psycopg.Error as exc:
            raise StoreUnavailable(f"could not {action} the batch ledger {self.where}: "
                                   f"{first_line(exc)}") from exc

    def _check_server(self, allow_unsafe: bool) -> None:
        """A server that acknowledges before it flushes is refused, as an ephemeral disk is."""
        from chatstate.stores.postgres._guard import server_report

        report = server_report(self._db, self.where, f"the batch ledger {self.where}")
        if report.verdict == "ephemeral" and not allow_unsafe:
            raise EphemeralStoreError(
                f"refusing the batch ledger {self.where}: {' '.join(report.reasons[:-1])} Turn "
                "it on, or accept the loss with --allow-ephemeral, allow_ephemeral=True or "
                "CHATSTATE_ALLOW_EPHEMERAL=1.")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction on the autocommit connection.

        A transaction left open by a call that Ctrl-C cut short (inside psycopg's
        ``__enter__``, after BEGIN) is rolled back first: inside it, ``transaction()``
        would only open a savepoint, and nothing after would ever commit.
        """
        from psycopg.pq import TransactionStatus

        if self._db.info.transaction_status != TransactionStatus.IDLE:
            self._db.rollback()
        with uninterruptible(), self._db.transaction():  # no Ctrl-C mid-query either
            yield

    def _migrate(self) -> None:
        """Named, append-only migrations, applied under an advisory lock (hosts start at once)."""
        @contextmanager
        def begin() -> Iterator[Any]:
            with self._transaction():
                yield self._db

        with self._translate("migrate"):
            run(PgBackend(self._db, self.schema, table=MIGRATIONS_TABLE, columns=MIGRATIONS_COLUMNS,
                          where=f"{self.where} (schema {self.schema})",
                          what="chatstate batch ledger", begin=begin), MIGRATIONS)

    def close(self) -> None:
        self._db.close()

    def _exec(self, sql: str, args: Iterable[Any] = (), *,
              applied: tuple[str, tuple[Any, ...]] | None = None) -> Any:
        """One write; run again after a lost session, so it must be safe to apply twice.

        ``applied`` is a SELECT that finds the row as this very call leaves it, with the
        columns the write returns: on a re-run, a row it finds means the first run
        committed (its ack was lost), and its cursor is the answer, not a second write
        that would find the row no longer matching and answer "not applied".
        """
        params = tuple(args)

        def run(again: bool) -> Any:
            if again and applied is not None:
                found = self._db.execute(applied[0], applied[1])
                if found.rowcount > 0:
                    return found
            return self._db.execute(sql, params)

        return self._retrying("write to", run)

    def _read(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        params = tuple(args)
        return self._retrying("read", lambda _: self._db.execute(sql, params).fetchall())
