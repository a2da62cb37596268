"""The s3 store's writer lease: ``_leases/<id>.json``.

Created with If-None-Match and replaced with If-Match, so two hosts cannot both take
it. Expiry is judged by the writers' clocks.

Without transactions a fenced write cannot check the lease in the same step as the
write: it reads the lease object just before, and its write is itself conditional
(see ``S3Store.save_partial``), so a writer that lost the lease to another cannot
replace what the other wrote after it.
"""

from __future__ import annotations

import json
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
            holder = holder_of(held, lease)
            if holder is not None:
                return holder
        data = json.dumps(lease_record(lease)).encode()
        try:
            self.io.put(key, data, create=blob is None, etag=blob.etag if blob else None,
                        action="take the writer lease of")
        except (Exists, Stale):  # another writer took it between our read and our write
            return self._try_lease(lease)
        return None

    def _drop_lease(self, lease: Lease) -> None:
        key = lease_key(lease.conversation_id)
        blob = self.io.get(key, "read the writer lease of")
        if blob is not None and json.loads(blob.data).get("owner") == lease.owner:
            self.io.delete([key], "release the writer lease of")
