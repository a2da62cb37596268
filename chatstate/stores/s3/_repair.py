"""Quarantine for the s3 store: copy a (damaged) conversation's objects aside, then remove them.

Nothing is parsed (the objects may be damaged) and nothing is deleted before its
copy under ``quarantine/<id>.<time>/`` is acknowledged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chatstate.core.transcript import now_iso
from chatstate.errors import ConversationNotFound
from chatstate.stores.s3 import _doc as doc

if TYPE_CHECKING:
    from chatstate.stores.s3._transport import S3IO

QUARANTINE = "quarantine"


def quarantine(io: S3IO, cid: str, url: str) -> str:
    keys = [key for key, _ in io.keys(doc.conv_dir(cid))]
    index = io.get(doc.index_key(cid))
    if not keys and index is None:
        raise ConversationNotFound(f"no conversation {cid!r} in {url}")
    target = f"{QUARANTINE}/{cid}.{now_iso().replace(':', '')}"
    for key in keys:
        blob = io.get(key)
        if blob is not None:
            io.put(f"{target}/{key}", blob.data, create=True, action="quarantine")
    if index is not None:
        io.put(f"{target}/{doc.index_key(cid)}", index.data, create=True, action="quarantine")
    # the same order as delete(): out of listings first, the header (which keeps the id
    # taken) last, so an interrupted quarantine is finished by running it again
    header = doc.header_key(cid)
    io.delete([doc.index_key(cid), *(k for k in reversed(keys) if k != header)])
    io.delete([header])
    return io.target.where(target)
