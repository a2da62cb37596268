"""The ledger's SQLite connections, with group commit for the threads of one run.

Every write is one statement that is durable when it returns (WAL,
``synchronous=FULL``: the commit fsyncs). With many threads, one fsync per
statement would make the disk the bottleneck, so writes are group-committed:
the first thread to arrive becomes the leader and runs every statement queued
so far in one transaction, then wakes the others with their results. Each
statement still applies (or not) on its own conditions, and its caller still
returns only after the commit that contains it. If the group fails, its
statements are retried one by one, so an error reaches only the statement that
caused it. Reads use a second connection and never wait for a commit.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from chatstate.batch._schema import APPLICATION_ID
from chatstate.durable.sqlite_setup import check_owner, configure, write_transaction

BUSY_TIMEOUT_MS = 30_000
LEDGER_WHAT = "chatstate batch ledger"
LEDGER_FIX = "Choose another --ledger."


class Result:
    """A finished statement: its rows and its row count."""

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self.rows, self.rowcount = rows, rowcount

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)


class _Op:
    __slots__ = ("args", "done", "error", "result", "sql")

    def __init__(self, sql: str, args: tuple[Any, ...]) -> None:
        self.sql, self.args = sql, args
        self.result: Result | None = None
        self.error: BaseException | None = None
        self.done = False


def connect(path: Path, *, network: bool) -> sqlite3.Connection:
    """A connection to the ledger at ``path``; a foreign database is refused before any write."""
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                         check_same_thread=False)
    try:
        check_owner(db, path, APPLICATION_ID, LEDGER_WHAT, LEDGER_FIX)
        configure(db, path, network=network, busy_timeout_ms=BUSY_TIMEOUT_MS)
    except BaseException:
        db.close()
        raise
    return db


class Database:
    """A writer connection shared by group commit, and a reader connection."""

    def __init__(self, path: Path, *, network: bool) -> None:
        self._writer = connect(path, network=network)
        try:
            self._reader = connect(path, network=network)
        except BaseException:
            self._writer.close()
            raise
        self._read_lock = threading.Lock()
        self._cv = threading.Condition()
        self._queue: list[_Op] = []
        self._busy = False

    def close(self) -> None:
        for db in (self._writer, self._reader):
            with suppress(sqlite3.Error):
                db.close()

    def read(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._read_lock:
            return self._reader.execute(sql, args).fetchall()

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> Result:
        """Run one statement; return once the commit that holds it is durable."""
        op = _Op(sql, args)
        with self._cv:
            self._queue.append(op)
            while not op.done:
                if self._busy:
                    self._cv.wait()
                    continue
                batch, self._queue = self._queue, []
                with self._leading():
                    self._commit(batch)
        if op.error is not None:
            raise op.error
        assert op.result is not None
        return op.result

    @contextmanager
    def _leading(self) -> Iterator[None]:
        """Hold the writer connection (called and left with ``_cv`` held)."""
        self._busy = True
        self._cv.release()
        try:
            yield
        finally:
            self._cv.acquire()
            self._busy = False
            self._cv.notify_all()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The writer connection in one BEGIN IMMEDIATE ... COMMIT of the caller's own."""
        with self._cv:
            while self._busy:
                self._cv.wait()
            with self._leading(), write_transaction(self._writer) as db:
                yield db

    def _commit(self, batch: list[_Op]) -> None:
        try:
            if len(batch) == 1 or not self._grouped(batch):
                for op in batch:
                    try:
                        op.result = self._run(op)
                    except (sqlite3.Error, OSError) as exc:
                        op.error = exc
        except BaseException as exc:  # e.g. Ctrl-C in a leading main thread
            for op in batch:
                if op.result is None and op.error is None:
                    op.error = exc
            raise
        finally:
            for op in batch:
                op.done = True

    def _grouped(self, batch: list[_Op]) -> bool:
        try:
            with write_transaction(self._writer):
                results = [self._run(op) for op in batch]
        except sqlite3.Error:
            return False
        for op, result in zip(batch, results, strict=True):
            op.result = result
        return True

    def _run(self, op: _Op) -> Result:
        cur = self._writer.execute(op.sql, op.args)
        rows = cur.fetchall()
        return Result(rows, cur.rowcount)
