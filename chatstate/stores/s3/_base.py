"""The s3 store's lifecycle and bookkeeping: open, close, open records, check().

``S3Store`` (in ``s3``) adds the conversation methods on top of this class.
"""

from __future__ import annotations

import os
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

from chatstate.core.transcript import Message, now_iso
from chatstate.errors import (
    ConfigurationError,
    ConversationNotFound,
    CorruptTranscriptError,
    StoreUnavailable,
)
from chatstate.stores.base import CheckReport, Location
from chatstate.stores.s3 import _chain as chain
from chatstate.stores.s3 import _doc as doc
from chatstate.stores.s3 import _server as server
from chatstate.stores.s3._transport import S3IO, Exists, S3Target, scrub

STORE_KIND = "chatstate-s3-store"


class S3StoreBase:
    """Lifecycle, open records and the readiness probe of the s3 store."""

    partial_flush_interval = 0.25
    """Seconds between flushes of a streamed reply (local stores flush every chunk)."""
    max_workers = 16
    """Concurrent GETs when loading a tail of segments or listing."""

    def __init__(self, target: S3Target, url: str) -> None:
        self.target = target
        self.url = url
        self.recovery: list[str] = []
        self._io: S3IO | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._chains: dict[str, list[Message]] = {}
        self._shifts: dict[str, int] = {}  # each cached chain's shift (see _chain)

    def location(self) -> Location:
        return Location(url=self.url, path=None,
                        remote=f"{self.target.endpoint_shown} bucket {self.target.bucket}")

    @property
    def io(self) -> S3IO:
        if self._io is None:
            raise ConfigurationError(f"store {self.url} is not open: use chatstate.open_store()")
        return self._io

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            raise ConfigurationError(f"store {self.url} is not open: use chatstate.open_store()")
        return self._pool

    def _where(self, key: str) -> str:
        return self.target.where(key)

    # -- lifecycle -------------------------------------------------------------------
    def open(self) -> None:
        """Check (or create) the store marker, and remove probes a killed check() left."""
        self._io = S3IO(self.target)
        self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="chatstate-s3")
        honoured = self.pool.submit(server.ensure, self.io)  # before anything is written
        pending = self.pool.submit(self.io.get, doc.MARKER, "open the store at")
        probes = self.io.keys(doc.PROBES)
        blob = pending.result()
        honoured.result()
        if blob is None:
            marker = doc.encode({"kind": STORE_KIND, "created_at": now_iso()})
            try:
                self.io.put(doc.MARKER, marker, create=True, action="create the store at")
            except Exists:
                blob = self.io.get(doc.MARKER, "open the store at")
        if blob is not None:
            where = self._where(doc.MARKER)
            if doc.decode(blob.data, where).get("kind") != STORE_KIND:
                raise CorruptTranscriptError(f"{where}: not a chatstate store marker; nothing "
                                             "was written. Use another prefix.", where=where)
        cutoff = datetime.now(timezone.utc) - timedelta(minutes=10)
        stale = [k for k, modified in probes if modified < cutoff]
        if stale:  # younger probes may belong to a check() running right now
            self.io.delete(stale)
            self.recovery.append(f"removed {len(stale)} probe object(s) left by a killed check")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._io = None
        self._chains.clear()
        self._shifts.clear()

    # -- shared reads ----------------------------------------------------------------
    def _header(self, cid: str) -> dict[str, Any]:
        blob = self.io.get(doc.header_key(cid))
        if blob is None:
            raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
        return doc.decode_header(blob.data, self._where(doc.header_key(cid)), cid)

    def _authoritative(self, cid: str, state: chain.IndexState | None = None) -> list[Message]:
        """The stored chain read from the objects themselves, checked against the head."""
        messages, shift, _ = chain.read_against_head(
            self.io, self.pool, cid, state or self.pool.submit(chain.get_index, self.io, cid))
        if not messages:
            self._header(cid)  # ConversationNotFound
        self._remember(cid, messages, shift)
        return messages

    def _remember(self, cid: str, messages: list[Message], shift: int) -> None:
        self._chains[cid] = list(messages)
        self._shifts[cid] = shift

    def _forget(self, cid: str) -> None:
        self._chains.pop(cid, None)
        self._shifts.pop(cid, None)

    def _shift(self, cid: str) -> int:
        """The shift of the chain ``_verified`` or ``_authoritative`` gave last."""
        return self._shifts.get(cid, 0)

    def _verified(self, cid: str, state: chain.IndexState) -> list[Message]:
        """The stored chain, verified before a write goes onto it.

        This process's copy when it still ends at the head the index records (the
        segments under it are write-once), at the same shift, else read and verified
        afresh.
        """
        cached = self._chains.get(cid)
        head = state.tail()
        if cached is not None and head is not None and \
                head == (len(cached), cached[-1].hash if cached else None) and \
                self._shifts.get(cid) == state.shift():
            return cached
        return self._authoritative(cid, state)

    # -- bookkeeping -----------------------------------------------------------------
    def record_open(self, record: dict[str, Any]) -> None:
        while True:  # a key collision needs the same microsecond and 32 random bits
            try:
                self.io.put(doc.open_key(record, secrets.token_hex(4)),
                            doc.encode({"record": record}), create=True,
                            action="record this open in")
                return
            except Exists:
                continue

    def opens(self) -> list[dict[str, Any]]:
        keys = [k for k, _ in self.io.keys(doc.OPENS)]
        out = []
        for key, blob in zip(keys, self.pool.map(self.io.get, keys), strict=True):
            if blob is None:
                continue
            record = doc.decode(blob.data, self._where(key)).get("record")
            if not isinstance(record, dict):
                raise CorruptTranscriptError(f"{self._where(key)}: not an open record; left as "
                                             "it is", where=self._where(key))
            out.append(record)
        return out

    def check(self) -> CheckReport:
        """Write, read back and delete a probe object. Never raises."""
        report = CheckReport(ok=False, url=self.url)
        key = f"{doc.PROBES}/{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        body = b"chatstate probe " + secrets.token_hex(8).encode()
        try:
            self.io.put(key, body, create=True, action="write a probe to")
            report.steps.append(f"wrote {self._where(key)} (acknowledged by "
                                f"{self.target.endpoint_shown})")
            blob = self.io.get(key, "read the probe back from")
            if blob is None or blob.data != body:
                raise StoreUnavailable(f"{self._where(key)}: the probe read back different bytes")
            report.steps.append("read it back")
            self.io.delete([key], "delete the probe")
            if self.io.get(key, "confirm the probe is gone from") is not None:
                raise StoreUnavailable(f"{self._where(key)}: the probe is still there after "
                                       "delete")
            report.steps.append("deleted it")
            server.recheck(self.io)
            report.steps.append("refused: a second create-only PUT (If-None-Match: *) and a "
                                f"PUT with a wrong If-Match ({self.target.endpoint_shown} "
                                "honours conditional writes)")
            report.ok = True
        except Exception as exc:  # check() reports, it never raises
            report.error = scrub(str(exc))
        return report
