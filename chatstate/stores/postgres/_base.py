"""The postgresql store's lifecycle and bookkeeping: guard, open, opens, check(), blobs.

``PostgresStore`` (in ``postgres``) adds the conversation methods on top.
"""

from __future__ import annotations

import json
import os
from typing import Any

from chatstate.durable.guard import Report
from chatstate.errors import ChatstateError, StoreUnavailable
from chatstate.stores.base import (
    CheckReport,
    blob_ref,
    checked_blob,
    refuse_damaged_blob,
    valid_digest,
)
from chatstate.stores.postgres._conn import PgConnection
from chatstate.stores.postgres._guard import server_report
from chatstate.stores.postgres._schema import migrate


class PgBase(PgConnection):
    """Open (migrate), open records, the readiness probe and the blob area."""

    partial_flush_interval = 0.0

    def durability_report(self) -> Report:
        """Ask the server how it acknowledges commits (the guard, before anything is written).

        Raises StoreUnavailable for a standby or a read-only server.
        """
        import psycopg

        with self._errors("reach"), psycopg.connect(self.target.conninfo, connect_timeout=10,
                                                    autocommit=True) as conn:
            return server_report(conn, self.target.shown, self.url)

    def open(self) -> None:
        self._connect_pool()
        with self._tx("create the schema in") as db:
            done = migrate(db, self.target.schema, f"{self.url} ({self.target.shown})")
            stale = db.execute("DELETE FROM probes RETURNING id").fetchall()
        if done and done[0] != "m001_initial":
            self.recovery.append(f"migrated the schema: {', '.join(done)}")
        if stale:
            self.recovery.append(f"removed {len(stale)} probe row(s) a killed check() left")

    # -- bookkeeping -----------------------------------------------------------------
    def record_open(self, record: dict[str, Any]) -> None:
        with self._tx("record this open in") as db:
            db.execute("INSERT INTO opens (record) VALUES (%s)",
                       (json.dumps(record, sort_keys=True),))

    def opens(self) -> list[dict[str, Any]]:
        with self._tx("read the opens of", read_only=True) as db:
            rows = db.execute("SELECT record FROM opens ORDER BY id").fetchall()
        return [json.loads(r[0]) for r in rows]

    def check(self) -> CheckReport:
        report = CheckReport(ok=False, url=self.url)
        key = f"probe-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            with self._tx("write a probe to") as db:
                db.execute("INSERT INTO probes (id, value) VALUES (%s, 'ok')", (key,))
            report.steps.append(f"wrote and committed a probe row to {self.target.shown}")
            with self._tx("read a probe from", read_only=True) as db:
                row = db.execute("SELECT value FROM probes WHERE id=%s", (key,)).fetchone()
            if row is None or row[0] != "ok":
                raise StoreUnavailable(f"{self.url}: the probe row did not read back")
            report.steps.append("read it back")
            with self._tx("delete a probe from") as db:
                db.execute("DELETE FROM probes WHERE id=%s", (key,))
            report.steps.append("deleted it")
            report.ok = True
        except ChatstateError as exc:
            report.error = self.target.scrub(str(exc))
        return report

    # -- blobs (BlobStore) -----------------------------------------------------------
    def put_blob(self, data: bytes, *, media_type: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        ref = blob_ref(data, media_type, name)
        with self._tx("store a blob in") as db:
            inserted = db.execute("INSERT INTO blobs (sha256, data, stored_at) VALUES "
                                  "(%s, %s, now()) ON CONFLICT DO NOTHING RETURNING 1",
                                  (ref["sha256"], data)).fetchone()
            if inserted is None:
                held = db.execute("SELECT length(data) FROM blobs WHERE sha256=%s",
                                  (ref["sha256"],)).fetchone()
                refuse_damaged_blob(self._blob_where(ref["sha256"]), ref["sha256"],
                                    held[0] if held else None, len(data))
                db.execute("UPDATE blobs SET stored_at=now() WHERE sha256=%s",  # young for gc
                           (ref["sha256"],))
        return ref

    def list_blobs(self) -> list[tuple[str, int, float]]:
        """(sha256, size, age) of every blob row (CollectsBlobs)."""
        with self._tx("list the blobs of", read_only=True) as db:
            rows = db.execute("SELECT sha256, length(data), extract(epoch FROM "
                              "now() - stored_at) FROM blobs").fetchall()
        return [(sha, size, float(age)) for sha, size, age in rows]

    def remove_blob(self, sha256: str, *, idle_for: float) -> bool:
        with self._tx("remove a blob from") as db:
            gone = db.execute("DELETE FROM blobs WHERE sha256=%s AND stored_at <= now() - "
                              "make_interval(secs => %s)",
                              (valid_digest(sha256), idle_for)).rowcount
        return bool(gone)

    def get_blob(self, sha256: str) -> bytes:
        with self._tx("read a blob from", read_only=True) as db:
            row = db.execute("SELECT data FROM blobs WHERE sha256=%s",
                             (valid_digest(sha256),)).fetchone()
        return checked_blob(self._blob_where(sha256), sha256,
                            bytes(row[0]) if row is not None else None)

    def has_blob(self, sha256: str) -> bool:
        return self._blob_sizes([sha256]).get(sha256) is not None

    def _blob_size(self, sha256: str) -> int | None:
        return self._blob_sizes([sha256]).get(sha256)

    def _blob_sizes(self, digests: list[str], db: Any = None) -> dict[str, int]:
        if not digests:
            return {}
        query = "SELECT sha256, length(data) FROM blobs WHERE sha256 = ANY(%s)"
        if db is not None:
            return dict(db.execute(query, (digests,)).fetchall())
        with self._tx("read blob sizes from", read_only=True) as conn:
            return dict(conn.execute(query, (digests,)).fetchall())

    def _blob_where(self, sha256: str) -> str:
        return f"{self.url} blob {sha256}"
