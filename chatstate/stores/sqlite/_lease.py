"""The sqlite store's writer lease: a ``leases`` row (migrations ``m006_leases``,
``m008_lease_stamps``), read and written in one ``BEGIN IMMEDIATE`` transaction.

Whether the row has lapsed is ``holder_of``'s call (by renewals, not wall clocks),
so it is read, judged and written under the write lock instead of in one upsert.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from chatstate.core.transcript import validate_id
from chatstate.stores.leases import Holder, Lease, LeaseMethods, holder_of, lease_record
from chatstate.stores.sqlite._conn import SqliteConnection

COLUMNS = ("owner", "host", "pid", "until", "stamp", "boot", "mono", "term")
LEASE_ROW = (f"INTO leases (conversation_id, {', '.join(COLUMNS)}) "
             f"VALUES (?{', ?' * len(COLUMNS)})")
"""A lease row's insert, after ``INSERT`` or ``INSERT OR REPLACE`` (``lease_values``)."""


def lease_values(cid: str, lease: Lease) -> tuple[Any, ...]:
    """``LEASE_ROW``'s values for ``lease`` on conversation ``cid``."""
    rec = lease_record(lease)
    return (cid, *(rec[c] for c in COLUMNS))


class SqliteLease(LeaseMethods, SqliteConnection):
    def _try_lease(self, lease: Lease) -> Holder | None:
        with self._tx("take the writer lease in") as db:
            return self._lease_in(db, lease)

    def _lease_in(self, db: sqlite3.Connection, lease: Lease) -> Holder | None:
        """Take or extend ``lease`` inside the write transaction ``db``."""
        cid = validate_id(lease.conversation_id)
        row = db.execute(f"SELECT {', '.join(COLUMNS)} FROM leases WHERE "
                         "conversation_id=?", (cid,)).fetchone()
        holder = holder_of(dict(zip(COLUMNS, row, strict=True)) if row else None, lease)
        if holder is None:
            db.execute("INSERT OR REPLACE " + LEASE_ROW, lease_values(cid, lease))
        return holder

    def _drop_lease(self, lease: Lease) -> None:
        with self._tx("release the writer lease in") as db:
            db.execute("DELETE FROM leases WHERE conversation_id=? AND owner=?",
                       (lease.conversation_id, lease.owner))
