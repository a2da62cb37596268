"""The sqlite store's writer lease: a ``leases`` row (migration ``m006_leases``), one upsert."""

from __future__ import annotations

import time

from chatstate.core.transcript import validate_id
from chatstate.stores.leases import Holder, Lease, LeaseMethods, lease_record
from chatstate.stores.sqlite._conn import SqliteConnection


class SqliteLease(LeaseMethods, SqliteConnection):
    def _try_lease(self, lease: Lease) -> Holder | None:
        rec = lease_record(lease)
        with self._tx("take the writer lease in") as db:
            taken = db.execute(
                "INSERT INTO leases AS l (conversation_id, owner, host, pid, until) VALUES "
                "(?, ?, ?, ?, ?) ON CONFLICT (conversation_id) DO UPDATE SET "
                "owner=excluded.owner, host=excluded.host, pid=excluded.pid, "
                "until=excluded.until WHERE l.owner=excluded.owner OR l.until < ? "
                "OR (l.host=? AND l.pid=?)",
                (validate_id(lease.conversation_id), lease.owner, lease.host, lease.pid,
                 rec["until"], time.time(), *(lease.dead or ("", -1)))).rowcount
            if taken:
                return None
            row = db.execute("SELECT host, pid, until FROM leases WHERE conversation_id=?",
                             (lease.conversation_id,)).fetchone()
        return Holder(row[0], row[1], row[2])

    def _drop_lease(self, lease: Lease) -> None:
        with self._tx("release the writer lease in") as db:
            db.execute("DELETE FROM leases WHERE conversation_id=? AND owner=?",
                       (lease.conversation_id, lease.owner))
