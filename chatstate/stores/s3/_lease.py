"""The s3 store's writer lease: ``_leases/<id>.json``.

Created with If-None-Match and replaced with If-Match, so two hosts cannot both take
it. Expiry is judged by the server's clock, never a writer's wall clock: the lease
object's ``Last-Modified`` is when its holder last wrote it, on the server's clock,
and ``term`` (in the record) how long that holds; "now" is the server's clock as
``_server.ServerClock`` keeps it (read at open, carried forward on a clock that
does not step). ``Last-Modified`` has whole seconds, so within about a second of
the end of a term (terms of a few seconds, a stalled holder) the holder's own
``until`` decides, as before; a live holder renews every third of its term, far
from that edge, so a writer whose clock is minutes off can neither take a live
lease nor keep a dead one. How long a lease runs on is said on that one clock too.

Without transactions a fenced write cannot check the lease in the same step as the
write: it reads the lease object just before, and its write is itself conditional
(see ``S3Store.save_partial``), so a writer that lost the lease to another cannot
replace what the other wrote after it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from chatstate.core.transcript import validate_id
from chatstate.stores.leases import (
    Holder,
    Lease,
    LeaseMethods,
    check_fence,
    holder_of,
    lease_record,
)


def lease_key(cid: str) -> str:
    return f"_leases/{validate_id(cid)}.json"


class S3Lease(LeaseMethods):
    io: Any

    def _check_fence(self, cid: str, fence: str | None) -> None:
        """LeaseLost unless ``fence`` owns the lease object, as read now."""
        if fence is None:
            return
        key = lease_key(cid)
        blob = self.io.get(key, "read the writer lease of")
        try:
            held = json.loads(blob.data) if blob is not None else None
        except ValueError:
            held = None  # unreadable: not provably ours
        check_fence(self.io.target.where(key), cid, fence, held)

    def _try_lease(self, lease: Lease) -> Holder | None:
        from chatstate.stores.s3._transport import Exists, Stale

        key = lease_key(lease.conversation_id)
        blob = self.io.get(key, "read the writer lease of")
        if blob is not None:
            try:
                held = json.loads(blob.data)
            except ValueError:
                held = None
            holder = holder_of(self._on_server_clock(held, blob), lease)
            if holder is not None:
                return holder
        data = json.dumps({**lease_record(lease), "term": lease.term}).encode()
        try:
            self.io.put(key, data, create=blob is None, etag=blob.etag if blob else None,
                        action="take the writer lease of")
        except (Exists, Stale):  # another writer took it between our read and our write
            return self._try_lease(lease)
        return None

    def _on_server_clock(self, held: Any, blob: Any) -> Any:
        """``held`` with ``until`` restated on this host's clock from the server's: a
        live lease runs on for the time left by the server's clock, an expired one is
        in the past. A record without ``term`` (an older chatstate) keeps its own."""
        from chatstate.stores.s3._server import server_clock

        term = held.get("term") if isinstance(held, dict) else None
        if not isinstance(term, int | float) or blob.modified is None:
            return held
        clock = server_clock(self.io)
        now, written = clock.now(), blob.modified.timestamp()  # written within [L, L+1)
        if now >= written + 1.0 + term:
            left = -1.0  # expired by the server's clock
        elif now + clock.slack < written + term:
            left = min(written + term - now, term)  # live by the server's clock
        else:  # within the clock's resolution of the end: the holder's own until decides
            until = held.get("until")
            live = isinstance(until, int | float) and until >= time.time()
            left = written + 1.0 + term - now if live else -1.0
        return {**held, "until": time.time() + left}

    def _drop_lease(self, lease: Lease) -> None:
        key = lease_key(lease.conversation_id)
        blob = self.io.get(key, "read the writer lease of")
        if blob is not None and json.loads(blob.data).get("owner") == lease.owner:
            self.io.delete([key], "release the writer lease of")
