"""The postgresql store's writer lease: a row in ``leases`` with ``until`` on the server's clock.

One upsert takes it: it inserts, or overwrites a row that is ours or has
expired, and returns nothing when a live row belongs to someone else. The
server's clock decides expiry, so hosts with skewed clocks agree.
"""

from __future__ import annotations

from typing import Any

from chatstate.stores.leases import Holder, Lease, LeaseMethods
from chatstate.stores.postgres._conn import PgConnection

TAKE = """INSERT INTO leases AS l (conversation_id, owner, host, pid, until)
    VALUES (%(cid)s, %(owner)s, %(host)s, %(pid)s, now() + make_interval(secs => %(term)s))
    ON CONFLICT (conversation_id) DO UPDATE SET owner = excluded.owner, host = excluded.host,
        pid = excluded.pid, until = excluded.until
    WHERE l.owner = excluded.owner OR l.until < now()
        OR (l.host = %(dead_host)s AND l.pid = %(dead_pid)s)
    RETURNING extract(epoch FROM until)"""


class PgLease(LeaseMethods, PgConnection):
    def _try_lease(self, lease: Lease) -> Holder | None:
        with self._tx("take the writer lease in") as db:
            return self._lease_in(db, lease)

    def _lease_in(self, db: Any, lease: Lease) -> Holder | None:
        """Take or extend ``lease`` inside the write transaction ``db``."""
        dead = lease.dead or ("", -1)
        row = db.execute(TAKE, {"cid": lease.conversation_id, "owner": lease.owner,
                                "host": lease.host, "pid": lease.pid,
                                "term": lease.term, "dead_host": dead[0],
                                "dead_pid": dead[1]}).fetchone()
        if row is not None:
            lease.until = float(row[0])
            return None
        held = db.execute("SELECT host, pid, extract(epoch FROM until) FROM leases WHERE "
                          "conversation_id=%s", (lease.conversation_id,)).fetchone()
        return Holder(held[0], held[1], float(held[2])) if held else Holder("?", 0, 0.0)

    def _drop_lease(self, lease: Lease) -> None:
        with self._tx("release the writer lease in") as db:
            db.execute("DELETE FROM leases WHERE conversation_id=%s AND owner=%s",
                       (lease.conversation_id, lease.owner))
