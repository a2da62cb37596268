"""What the drill's writer, checker and runner share: ids, phases, the event line format.

The writer reports on its stdout, one JSON array per line, written with one
``os.write`` (atomic on a pipe below PIPE_BUF), so a line is either whole or
absent when the writer dies:

    ["pid", PID]                  the writer runs
    ["w", OP]                     it enters a store operation (open, create, append, ...)
    ["a", OP, CID, ACKS]          the operation returned; for append, ACKS lists every
                                  message now acknowledged: [seq, hash, turn_id, role]
    ["b", CID, KIND]              a turn begins ("stream" or "plain"); nothing of it written
    ["call", CID]                 the model request starts
    ["d", CID, TURN_ID, TEXT]     text rendered, printed only after Chat yielded it
    ["e", CID, TURN_ID]           the turn is complete
    ["err", TEXT]                 the writer failed on its own
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from chatstate.stores.base import Store

PHASES = ("before_call", "mid_stream", "in_store_write")
PHASE_LABELS = {"before_call": "before call", "mid_stream": "mid-stream",
                "in_store_write": "in store write"}
ID_PREFIX = "drill-"


def conversation_ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


def stream_kind(index: int) -> str:
    """Every third conversation is plain (send), the others streamed."""
    return "plain" if index % 3 == 2 else "stream"


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else ""


def reopen(url: str, key: bytes | Literal["env"] | None = "env") -> Store:
    """A fresh store object, opened (which is recovery), without the guard or an open record.

    The drill opens the store hundreds of times; recording each open would bury
    the store's real history (``doctor``) under drill noise. The runner runs the
    durability guard once, through ``open_store``.

    ``key``: sealed by the configured key when one is (``"env"``, as ``open_store``
    does: the writers and the checker of ``drill --encrypted`` read and write sealed
    records), by these key bytes, or None: as stored (no key, nothing opened).
    """
    from chatstate.stores import store_class
    from chatstate.stores.keys import configured as key_configured

    store: Store = store_class(scheme_of(url)).from_url(url)
    store.open()
    if key is None or (key == "env" and not key_configured()):
        return store
    from chatstate.stores.sealed import seal_opened

    try:
        return seal_opened(store, key=key)
    except BaseException:
        store.close()
        raise


def encode(event: list[Any]) -> bytes:
    return (json.dumps(event, separators=(",", ":")) + "\n").encode()


def emit(event: list[Any], fd: int = 1) -> None:
    os.write(fd, encode(event))
