"""The sqlite store's blob area: the ``blobs`` table (migration ``m004_blobs``).

One row per digest, inserted in its own committed transaction (synchronous=FULL)
before any message naming it is appended. ``length(data)`` is read back for the
size check, so a row truncated by hand is caught on load.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from chatstate.stores.blobs import blob_ref, checked_blob, refuse_damaged_blob, valid_digest
from chatstate.stores.sqlite._conn import SqliteConnection


class SqliteBlobs(SqliteConnection):
    """SqliteStore's ``put_blob``, ``get_blob``, ``has_blob`` (see BlobStore)."""

    def put_blob(self, data: bytes, *, media_type: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        ref = blob_ref(data, media_type, name)
        with self._tx("store a blob in") as db:
            row = db.execute("SELECT length(data) FROM blobs WHERE sha256=?",
                             (ref["sha256"],)).fetchone()
            if row is None:
                db.execute("INSERT INTO blobs (sha256, data, stored_at) VALUES (?, ?, ?)",
                           (ref["sha256"], data, time.time()))
            else:
                refuse_damaged_blob(self._blob_where(ref["sha256"]), ref["sha256"], row[0],
                                    len(data))
                db.execute("UPDATE blobs SET stored_at=? WHERE sha256=?",  # young for gc
                           (time.time(), ref["sha256"]))
        return ref

    def list_blobs(self) -> list[tuple[str, int, float]]:
        """(sha256, size, age) of every blob row (CollectsBlobs)."""
        with self._reading() as db:
            rows = db.execute("SELECT sha256, length(data), stored_at FROM blobs").fetchall()
        now = time.time()
        return [(sha, size, now - at) for sha, size, at in rows]

    def remove_blob(self, sha256: str, *, idle_for: float) -> bool:
        with self._tx("remove a blob from") as db:
            gone = db.execute("DELETE FROM blobs WHERE sha256=? AND stored_at<=?",
                              (valid_digest(sha256), time.time() - idle_for)).rowcount
        return bool(gone)

    def get_blob(self, sha256: str) -> bytes:
        with self._reading() as db:
            row = db.execute("SELECT data FROM blobs WHERE sha256=?",
                             (valid_digest(sha256),)).fetchone()
        return checked_blob(self._blob_where(sha256), sha256,
                            bytes(row[0]) if row is not None else None)

    def has_blob(self, sha256: str) -> bool:
        return self._blob_size(sha256) is not None

    def _blob_size(self, sha256: str) -> int | None:
        return self._blob_sizes([sha256]).get(sha256)

    def _blob_sizes(self, digests: list[str]) -> dict[str, int]:
        """Stored sizes of these digests (absent ones left out), in one query per 500."""
        out: dict[str, int] = {}
        with self._reading() as db:
            for chunk in _chunks(digests, 500):
                marks = ",".join("?" * len(chunk))
                out.update(db.execute(f"SELECT sha256, length(data) FROM blobs WHERE sha256 "
                                      f"IN ({marks})", chunk).fetchall())
        return out

    def _blob_where(self, sha256: str) -> str:
        return f"{self.path} blob {sha256}"


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
