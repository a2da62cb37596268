"""The shared batch ledger in PostgreSQL: many hosts, one queue, claims with leases.

``postgresql://user@host:5432/db?schema=chatstate_batch`` (credentials from the
URL, the libpq environment or ``.pgpass``; never stored, never printed). Every
statement runs in its own transaction (autocommit), so it is durable when it
returns on a server that flushes before it acknowledges (checked on open).

A claim is one statement: ``UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED
LIMIT 1)``. It takes the oldest row that is ``pending``, or ``running`` with a
lapsed lease (its worker died or froze), counts the attempt and sets
``lease_until``; workers on other hosts skip the rows it has locked instead of
waiting for them. A heartbeat (``renew``) extends the leases of the rows a
worker holds while their requests are in flight. Every later step applies only
while the row is still this worker's, so a worker that wakes up after its row
was taken over finds out and drops its result.

A lost connection is reconnected and the statement run again (``_pgsession``):
every statement is safe to run twice, reads trivially, and each write says why at
its method.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from chatstate.batch._pgschema import is_url, shown
from chatstate.batch._pgsession import DEFAULT_LEASE, DEFAULT_RECONNECT, PgSession
from chatstate.batch.ledger import STATUSES, Claim, Row
from chatstate.batch.workers import Worker
from chatstate.core.transcript import now_iso

__all__ = ["DEFAULT_LEASE", "DEFAULT_RECONNECT", "PgLedger", "is_url", "shown"]

_LEASE = "clock_timestamp() + %s * interval '1 second'"
_ROW_COLUMNS = ("id, status, attempts, output_path, output_sha256, writing_sha256, worker, "
                "last_error, done_at, conversation_id, lease_until > clock_timestamp()")


class PgLedger(PgSession):
    """The ``LedgerAPI`` on PostgreSQL, over one ``PgSession``."""

    # -- meta and workers --------------------------------------------------------
    def meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key=%s", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str, *, only_if_absent: bool = False) -> str:
        then = "NOTHING" if only_if_absent else "UPDATE SET value=EXCLUDED.value"
        self._exec(f"INSERT INTO meta(key, value) VALUES (%s, %s) ON CONFLICT (key) DO {then}",
                   (key, value))
        return self.meta(key) or value

    def add_worker(self, w: Worker) -> None:
        # re-run safety: a worker id is one process's; a second insert is only ever a re-run
        self._exec("INSERT INTO workers(id, host, pid, boot_id, start_ticks, started_at) "
                   "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                   (w.id, w.host, w.pid, w.boot_id, w.start_ticks, now_iso()))

    def end_worker(self, worker_id: str) -> None:
        self._exec("UPDATE workers SET ended_at=%s WHERE id=%s", (now_iso(), worker_id))

    def workers(self, ids: Iterable[str]) -> dict[str, tuple[Any, ...]]:
        rows = self._read("SELECT id, host, pid, boot_id, start_ticks, ended_at FROM workers "
                          "WHERE id = ANY(%s)", (sorted(set(ids)),))
        return {r[0]: tuple(r[1:]) for r in rows}

    # -- records -----------------------------------------------------------------
    def register(self, records: Iterable[tuple[str, str, str, str]]) -> tuple[int, list[str]]:
        """Insert rows not yet known (any number of hosts at once); report changed texts."""
        rows = list(records)
        cols = [list(c) for c in zip(*rows, strict=True)] if rows else [[], [], [], []]
        now = now_iso()

        # Safe to run again: the insert skips rows already there. After a commit whose ack
        # was lost, the retry counts those rows as known, not added (their text is the same).
        def run(_: bool) -> tuple[dict[str, str], int]:
            with self._transaction():
                known = dict(self._db.execute(
                    "SELECT id, text_sha256 FROM records WHERE id = ANY(%s)",
                    (cols[0],)).fetchall())
                added = self._db.execute(
                    "INSERT INTO records(id, text, text_sha256, output_path, created_at, "
                    "updated_at) SELECT i, t, s, o, %s, %s FROM unnest(%s::text[], %s::text[], "
                    "%s::text[], %s::text[]) WITH ORDINALITY AS u(i, t, s, o, n) ORDER BY n "
                    "ON CONFLICT DO NOTHING", (now, now, *cols)).rowcount
            return known, int(added)

        known, added = self._retrying("register records in", run)
        changed = [rid for rid, _, sha, _ in rows if rid in known and known[rid] != sha]
        return added, changed

    def claim(self, worker_id: str, max_attempts: int, *, count: bool = False) -> Claim | None:
        """Take the oldest pending row, or a running one whose lease lapsed; None if none."""
        # Re-run safety: a claim whose ack was lost left its row running for this worker
        # with updated_at = this call's timestamp; the re-run returns that row (its attempt
        # counted once) instead of claiming a second one and stranding the first.
        n = 1 if count else 0
        now = now_iso()
        row = self._exec(
            "UPDATE records r SET status='running', worker=%s, attempts=r.attempts+%s, "
            f"writing_sha256=NULL, lease_until={_LEASE}, updated_at=%s "
            "FROM (SELECT seq FROM records WHERE attempts<%s AND (status='pending' OR "
            "(status='running' AND lease_until < clock_timestamp())) ORDER BY seq LIMIT 1 "
            "FOR UPDATE SKIP LOCKED) c WHERE r.seq=c.seq "
            "RETURNING r.id, r.text, r.attempts-%s, r.output_path",
            (worker_id, n, self.lease_seconds, now, max_attempts, n),
            applied=("SELECT id, text, attempts-%s, output_path FROM records WHERE "
                     "status='running' AND worker=%s AND updated_at=%s", (n, worker_id, now)),
        ).fetchone()
        return None if row is None else Claim(row[0], row[1], row[2], row[3])

    def count_attempt(self, rid: str, worker_id: str, max_attempts: int) -> bool:
        # Re-run safety: the row still this worker's with updated_at = this call's timestamp
        # means the first run counted the attempt; it is not counted twice.
        now = now_iso()
        cur = self._exec("UPDATE records SET attempts=attempts+1, updated_at=%s WHERE id=%s AND "
                         "status='running' AND worker=%s AND attempts<%s",
                         (now, rid, worker_id, max_attempts),
                         applied=("SELECT 1 FROM records WHERE id=%s AND status='running' AND "
                                  "worker=%s AND updated_at=%s", (rid, worker_id, now)))
        return bool(cur.rowcount == 1)

    def set_writing(self, rid: str, worker_id: str, sha: str) -> bool:
        """Only under a live lease (extended here): a lapsed one may be taken over any moment."""
        cur = self._exec(f"UPDATE records SET writing_sha256=%s, lease_until={_LEASE} "
                         "WHERE id=%s AND status='running' AND worker=%s "
                         "AND lease_until > clock_timestamp()",
                         (sha, self.lease_seconds, rid, worker_id),
                         # re-run safety: still this worker's row with this sha = applied
                         # (a takeover would have changed the worker and cleared the sha)
                         applied=("SELECT 1 FROM records WHERE id=%s AND status='running' AND "
                                  "worker=%s AND writing_sha256=%s", (rid, worker_id, sha)))
        return bool(cur.rowcount == 1)

    def finish(self, rid: str, worker_id: str | None, sha: str,
               conversation_id: str | None = None) -> bool:
        now = now_iso()
        cur = self._exec(
            "UPDATE records SET status='done', output_sha256=%s, writing_sha256=NULL, "
            "worker=NULL, lease_until=NULL, last_error=NULL, "
            "conversation_id=coalesce(%s, conversation_id), done_at=%s, updated_at=%s "
            "WHERE id=%s AND status='running' AND worker IS NOT DISTINCT FROM %s",
            (sha, conversation_id, now, now, rid, worker_id),
            # re-run safety: done with this sha at this call's timestamp = this call applied
            applied=("SELECT 1 FROM records WHERE id=%s AND status='done' AND "
                     "output_sha256=%s AND done_at=%s", (rid, sha, now)))
        return bool(cur.rowcount == 1)

    def fail(self, rid: str, worker_id: str | None, error: str, *, final: bool,
             max_attempts: int) -> str | None:
        now = now_iso()
        row = self._exec(
            "UPDATE records SET status=CASE WHEN %s OR attempts>=%s THEN 'failed' ELSE "
            "'pending' END, last_error=%s, worker=NULL, writing_sha256=NULL, lease_until=NULL, "
            "updated_at=%s WHERE id=%s AND status='running' "
            "AND worker IS NOT DISTINCT FROM %s RETURNING status",
            (final, max_attempts, error, now, rid, worker_id),
            # re-run safety: released with this error at this call's timestamp = applied
            applied=("SELECT status FROM records WHERE id=%s AND worker IS NULL AND status IN "
                     "('pending', 'failed') AND last_error=%s AND updated_at=%s",
                     (rid, error, now))).fetchone()
        return None if row is None else str(row[0])

    # release, requeue_failed, expire and renew are set-based: a re-run applies to what is
    # left, and their counts are only reported (a re-run after a lost ack reports fewer).
    def release(self, worker_id: str, max_attempts: int, error: str) -> int:
        return int(self._exec(
            "UPDATE records SET status=CASE WHEN attempts>=%s THEN 'failed' ELSE 'pending' END, "
            "last_error=CASE WHEN attempts>=%s THEN %s ELSE last_error END, worker=NULL, "
            "writing_sha256=NULL, lease_until=NULL, updated_at=%s "
            "WHERE worker=%s AND status='running'",
            (max_attempts, max_attempts, error, now_iso(), worker_id)).rowcount)

    def redo(self, rid: str, sha: str, why: str) -> bool:
        now = now_iso()
        return bool(self._exec(
            "UPDATE records SET status='pending', attempts=0, output_sha256=NULL, "
            "last_error=%s, done_at=NULL, updated_at=%s "
            "WHERE id=%s AND status='done' AND output_sha256=%s",
            (why, now, rid, sha),
            # re-run safety: pending with this reason at this call's timestamp = applied
            applied=("SELECT 1 FROM records WHERE id=%s AND status='pending' AND "
                     "last_error=%s AND updated_at=%s", (rid, why, now))).rowcount == 1)

    def requeue_failed(self) -> list[str]:
        rows = self._exec("UPDATE records SET status='pending', attempts=0, updated_at=%s "
                          "WHERE status='failed' RETURNING id", (now_iso(),)).fetchall()
        return sorted(r[0] for r in rows)

    def expire(self, max_attempts: int) -> list[str]:
        """Pending rows, and lapsed running ones, that used their attempts become failed."""
        rows = self._exec(
            "UPDATE records SET status='failed', worker=NULL, lease_until=NULL, "
            "last_error=coalesce(last_error, %s), updated_at=%s WHERE attempts>=%s AND "
            "(status='pending' OR (status='running' AND lease_until < clock_timestamp())) "
            "RETURNING id", (f"used its {max_attempts} attempts", now_iso(),
                             max_attempts)).fetchall()
        return sorted(r[0] for r in rows)

    def renew(self, worker_id: str) -> int:
        return int(self._exec(f"UPDATE records SET lease_until={_LEASE} "
                              "WHERE worker=%s AND status='running'",
                              (self.lease_seconds, worker_id)).rowcount)

    def wait_hint(self, worker_id: str) -> float | None:
        row = self._read(
            "SELECT extract(epoch FROM min(lease_until) - clock_timestamp()) FROM records "
            "WHERE status='running' AND worker <> %s", (worker_id,))[0]
        return None if row[0] is None else max(float(row[0]), 0.0)

    def rows(self, status: str | None = None) -> list[Row]:
        where, args = ("WHERE status=%s", (status,)) if status else ("", ())
        rows = self._read(f"SELECT {_ROW_COLUMNS} FROM records {where} ORDER BY seq", args)
        return [Row(*r[:10], leased=bool(r[10]) if r[1] == "running" else None)  # type: ignore[misc]
                for r in rows]

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for status, n in self._read("SELECT status, count(*) FROM records GROUP BY status"):
            counts[status] = int(n)
        return counts

