"""The batch ledger: one SQLite row per input record, the single source of truth for a run.

WAL with ``synchronous=FULL``, so a statement that returned is on disk. Every
state change is one conditional statement whose row count decides whether it
happened: ``claim`` moves the oldest ``pending`` row to ``running`` under this
worker's id, and every later step (``count_attempt``, ``finish``, ``fail``)
applies only while the row is still ``running`` under the same worker. Two
runners on one ledger therefore never own the same record; a worker whose row
was taken from it (because it was wrongly judged dead) finds out instead of
overwriting. The threads of a run share one writer connection through group
commit (``_db``); other processes are serialised by SQLite's own locks.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatstate.batch._db import LEDGER_FIX, LEDGER_WHAT, Database, Result
from chatstate.batch._schema import APPLICATION_ID, MIGRATIONS
from chatstate.batch.workers import Worker
from chatstate.core.transcript import now_iso
from chatstate.durable.files import ensure_dir
from chatstate.durable.migrations import run
from chatstate.durable.sqlite_setup import SqliteBackend, translate
from chatstate.errors import ConfigurationError

STATUSES = ("pending", "running", "done", "failed")


@dataclass(frozen=True)
class Claim:
    """A record this worker now owns: status ``running``, ``attempts`` already used."""

    id: str
    text: str
    attempts: int
    output_path: str


@dataclass(frozen=True)
class Row:
    id: str
    status: str
    attempts: int
    output_path: str
    output_sha256: str | None
    writing_sha256: str | None
    worker: str | None
    last_error: str | None
    done_at: str | None
    conversation_id: str | None
    leased: bool | None = None
    """A shared ledger's verdict on the holder: lease still running (True) or lapsed (False).
    None on SQLite, where the holder's process is checked instead (``workers.liveness``)."""


_ROW_COLUMNS = ("id, status, attempts, output_path, output_sha256, writing_sha256, worker, "
                "last_error, done_at, conversation_id")


class Ledger:
    """Open with ``Ledger.open``; safe to share between threads (writes are group-committed).

    The one-host ledger; ``pgledger.PgLedger`` is the shared one. Both implement
    ``_api.LedgerAPI``.
    """

    where = ""
    lease_seconds: float | None = None  # no leases: a holder's liveness is checked by pid

    def __init__(self, path: Path, *, network: bool = False) -> None:
        self.path = path
        self.where = str(path)
        with translate(path, "open"):
            self._db = Database(path, network=network)

    @classmethod
    def open(cls, path: Path, *, create: bool, network: bool = False) -> Ledger:
        """Open (and with ``create``, create and migrate) the ledger at ``path``."""
        if not path.exists():
            if not create:
                raise ConfigurationError(f"no batch ledger at {path}: start one with "
                                         "`chatstate batch run INPUT --prompt ... --out DIR`")
            ensure_dir(path.parent)
            with translate(path, "create"):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        ledger = cls(path, network=network)
        try:
            with translate(path, "migrate"):  # an up-to-date ledger opens without a write
                run(SqliteBackend(path, APPLICATION_ID, LEDGER_WHAT, LEDGER_FIX,
                                  read=ledger._db.read, transaction=ledger._db.transaction),
                    MIGRATIONS)
        except BaseException:
            ledger.close()
            raise
        return ledger

    def close(self) -> None:
        self._db.close()

    def _exec(self, sql: str, args: Iterable[Any] = ()) -> Result:
        """One write statement: applied on its own conditions, durable when it returns."""
        with translate(self.path, "write"):
            return self._db.execute(sql, tuple(args))

    def _read(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        with translate(self.path, "read"):
            return self._db.read(sql, tuple(args))

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with translate(self.path, "write"), self._db.transaction() as db:
            yield db

    # -- meta and workers --------------------------------------------------------
    def meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key=?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str, *, only_if_absent: bool = False) -> str:
        """Store ``value`` (``only_if_absent``: keep an existing one); return what is stored."""
        verb = "INSERT OR IGNORE" if only_if_absent else "INSERT OR REPLACE"
        self._exec(f"{verb} INTO meta(key, value) VALUES (?, ?)", (key, value))
        return self.meta(key) or value

    def add_worker(self, w: Worker) -> None:
        self._exec("INSERT INTO workers(id, host, pid, boot_id, start_ticks, started_at) "
                   "VALUES (?, ?, ?, ?, ?, ?)",
                   (w.id, w.host, w.pid, w.boot_id, w.start_ticks, now_iso()))

    def end_worker(self, worker_id: str) -> None:
        self._exec("UPDATE workers SET ended_at=? WHERE id=?", (now_iso(), worker_id))

    def workers(self, ids: Iterable[str]) -> dict[str, tuple[Any, ...]]:
        """id -> (host, pid, boot_id, start_ticks, ended_at) for the given worker ids."""
        out = {}
        for wid in set(ids):
            rows = self._read("SELECT host, pid, boot_id, start_ticks, ended_at FROM workers "
                              "WHERE id=?", (wid,))
            if rows:
                out[wid] = tuple(rows[0])
        return out

    # -- records -----------------------------------------------------------------
    def register(self, records: Iterable[tuple[str, str, str, str]]) -> tuple[int, list[str]]:
        """Insert (id, text, text_sha256, output_path) rows not yet known, idempotently.

        Returns (number added, ids whose registered text differs from the input now);
        a changed record keeps its registered text and status.
        """
        added, changed, now = 0, [], now_iso()
        with self._tx() as db:
            for rid, text, sha, out in records:
                row = db.execute("SELECT text_sha256 FROM records WHERE id=?", (rid,)).fetchone()
                if row is not None:
                    if row[0] != sha:
                        changed.append(rid)
                    continue
                db.execute("INSERT INTO records(id, text, text_sha256, output_path, created_at, "
                           "updated_at) VALUES (?, ?, ?, ?, ?, ?)", (rid, text, sha, out, now, now))
                added += 1
        return added, changed

    def claim(self, worker_id: str, max_attempts: int, *, count: bool = False) -> Claim | None:
        """Take the oldest pending record with attempts left, or None. One atomic statement.

        With ``count``, the claim also counts the first attempt: for a caller that
        sends its request right away (nothing to persist in between).
        ``Claim.attempts`` is the number used *before* this claim either way.
        """
        n = 1 if count else 0
        row = self._exec(
            "UPDATE records SET status='running', worker=?, attempts=attempts+?, "
            "writing_sha256=NULL, updated_at=? "
            "WHERE rowid=(SELECT rowid FROM records WHERE status='pending' AND attempts<? "
            "ORDER BY rowid LIMIT 1) AND status='pending' "
            "RETURNING id, text, attempts-?, output_path",
            (worker_id, n, now_iso(), max_attempts, n)).fetchone()
        return None if row is None else Claim(row[0], row[1], row[2], row[3])

    def count_attempt(self, rid: str, worker_id: str, max_attempts: int) -> bool:
        """Count a request for ``rid`` about to be sent. False: none left, or not ours."""
        cur = self._exec("UPDATE records SET attempts=attempts+1, updated_at=? WHERE id=? AND "
                         "status='running' AND worker=? AND attempts<?",
                         (now_iso(), rid, worker_id, max_attempts))
        return cur.rowcount == 1

    def set_writing(self, rid: str, worker_id: str, sha: str) -> bool:
        cur = self._exec("UPDATE records SET writing_sha256=? WHERE id=? AND status='running' "
                         "AND worker=?", (sha, rid, worker_id))
        return cur.rowcount == 1

    def finish(self, rid: str, worker_id: str | None, sha: str,
               conversation_id: str | None = None) -> bool:
        """Mark done with the output's hash, if still ours (``worker_id`` None: any dead holder)."""
        now = now_iso()
        cur = self._exec(
            "UPDATE records SET status='done', output_sha256=?, writing_sha256=NULL, worker=NULL, "
            "last_error=NULL, conversation_id=coalesce(?, conversation_id), done_at=?, "
            "updated_at=? WHERE id=? AND status='running' AND worker IS ?",
            (sha, conversation_id, now, now, rid, worker_id))
        return cur.rowcount == 1

    def fail(self, rid: str, worker_id: str | None, error: str, *, final: bool,
             max_attempts: int) -> str | None:
        """Give the row up: ``failed`` if final or out of attempts, else back to ``pending``.

        Returns the new status, or None if the row was not (any longer) this worker's.
        """
        row = self._exec(
            "UPDATE records SET status=CASE WHEN ? OR attempts>=? THEN 'failed' ELSE 'pending' "
            "END, last_error=?, worker=NULL, writing_sha256=NULL, updated_at=? "
            "WHERE id=? AND status='running' AND worker IS ? RETURNING status",
            (final, max_attempts, error, now_iso(), rid, worker_id)).fetchone()
        return None if row is None else str(row[0])

    def release(self, worker_id: str, max_attempts: int, error: str) -> int:
        """Hand back every row this worker still holds (on an interrupted run)."""
        return self._exec(
            "UPDATE records SET status=CASE WHEN attempts>=? THEN 'failed' ELSE 'pending' END, "
            "last_error=CASE WHEN attempts>=? THEN ? ELSE last_error END, worker=NULL, "
            "writing_sha256=NULL, updated_at=? WHERE worker=? AND status='running'",
            (max_attempts, max_attempts, error, now_iso(), worker_id)).rowcount

    def redo(self, rid: str, sha: str, why: str) -> bool:
        """A done row whose output was lost or changed: back to pending with fresh attempts."""
        return self._exec(
            "UPDATE records SET status='pending', attempts=0, output_sha256=NULL, last_error=?, "
            "done_at=NULL, updated_at=? WHERE id=? AND status='done' AND output_sha256=?",
            (why, now_iso(), rid, sha)).rowcount == 1

    def requeue_failed(self) -> list[str]:
        """Failed rows back to pending with fresh attempts (an explicit --retry-failed)."""
        rows = self._exec(
            "UPDATE records SET status='pending', attempts=0, updated_at=? "
            "WHERE status='failed' RETURNING id", (now_iso(),)).fetchall()
        return sorted(r[0] for r in rows)

    def expire(self, max_attempts: int) -> list[str]:
        """Pending rows that already used ``max_attempts`` become failed; returns their ids."""
        rows = self._exec(
            "UPDATE records SET status='failed', last_error=coalesce(last_error, ?), "
            "updated_at=? WHERE status='pending' AND attempts>=? RETURNING id",
            (f"used its {max_attempts} attempts", now_iso(), max_attempts)).fetchall()
        return sorted(r[0] for r in rows)

    def rows(self, status: str | None = None) -> list[Row]:
        where, args = ("WHERE status=?", (status,)) if status else ("", ())
        rows = self._read(f"SELECT {_ROW_COLUMNS} FROM records {where} ORDER BY rowid", args)
        return [Row(*r) for r in rows]

    def renew(self, worker_id: str) -> int:
        """Leases are for shared ledgers; here a holder's process is checked instead."""
        return 0

    def wait_hint(self, worker_id: str) -> float | None:
        """One host: nothing to wait for once no row can be claimed."""
        return None

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for status, n in self._read("SELECT status, count(*) FROM records GROUP BY status"):
            counts[status] = n
        return counts
