"""The postgresql store's lifecycle: the guard, open (migrate), and the blob area.

``PostgresStore`` (in ``postgres``) adds the conversation methods on top.
"""

from __future__ import annotations

from typing import Any

from chatstate.durable.guard import Report
from chatstate.stores.blobs import blob_ref, checked_blob, refuse_damaged_blob, valid_digest
from chatstate.stores.postgres._conn import PgConnection
from chatstate.stores.postgres._guard import server_report
from chatstate.stores.postgres._schema import migrate


class PgBase(PgConnection):
    """Open (migrate) and the blob area (open records and check() are the relational core's)."""

    partial_flush_interval = 0.0

    def durability_report(self) -> Report:
        """Ask the server how it acknowledges commits (the guard, before anything is written).

        Raises StoreUnavailable for a standby or a read-only server.
        """
        import psycopg

        with self._errors("reach"), psycopg.connect(self.target.conninfo, connect_timeout=10,
                                                    autocommit=True) as conn:
            report = server_report(conn, self.target.shown, self.url)
        if self._pool is None:  # the guard at open: an ephemeral server passed it, so allowed
            self.verdict_at_open = report.verdict
        return report

    def open(self) -> None:
        self._connect_pool()
        with self._tx("create the schema in") as db:
            done = migrate(db, self.target.schema, f"{self.url} ({self.target.shown})")
            stale = db.execute("DELETE FROM probes RETURNING id").fetchall()
        if done and done[0] != "m001_initial":
            self.recovery.append(f"migrated the schema: {', '.join(done)}")
        if stale:
            self.recovery.append(f"removed {len(stale)} probe row(s) a killed check() left")

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
