"""Reading a conversation's chain from segments and snapshots, and its listing index.

A *segment* ``m/<first seq>.json`` holds the messages of one append (usually
one). It is created with If-None-Match: * and never rewritten, so the key of
the first seq is the compare-and-append: two writers racing for a seq race for
one key and exactly one wins. Before creating ``m/<s>`` a writer proves that
seq ``s - 1`` ends a stored segment (from the index, or by reading the chain),
which keeps segments a partition of the seqs: no overlap, no gap.

A *snapshot* ``snap/<seq>.json`` holds messages ``0..seq`` and is written when
an append crosses a multiple of ``SNAPSHOT_EVERY``, always at the end of the
segment just written. Loading reads the newest snapshot plus the segments
after it: a bounded number of requests however long the conversation is.

The *index* ``index/<id>.json`` holds the listing (title, times) and the
conversation's head: message count and last hash. It only ever moves forward,
by If-Match, and only to a seq that ends a segment, so it may lag (a writer
killed between its append and the index update; ``load`` repairs that) but
never run ahead. A stored chain shorter than the head, or with another hash at
the head's seq, therefore lost objects (``check_head``): that is corruption,
never a free seq to append at. Old data without an index loads unchecked.

A *rewrite* (``S3Store.rewrite``, for ``chatstate rekey``) replaces every stored
message at once: one segment object holding the whole chain again (seq 0 on),
created with If-None-Match at the key the next append would take. Segment keys are
therefore *slots*: ``m/<slot>.json``, the slot of a seq being the seq plus the
*shift*, the number of rewrites before it (0 for a conversation never rewritten,
so its keys are its seqs, as before). A writer racing the rewrite races for that
one key: an append that wins makes the rewrite conflict (it is read and done
again), and one that loses reads the rewritten chain and conflicts (its messages
chain from the old stored hashes; the sealing store seals them again). Objects
before a rewrite are superseded, never read as the chain again, and removed after it
(a reader passes over a gap, or an object gone, before a rewrite segment). A snapshot and the
index carry the shift they were written at (``shift``, absent when 0); the index
moves forward in (shift, message count), and a head of a smaller shift than the
stored chain is one a rewrite replaced, so only its count is checked.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from chatstate.core.transcript import Message, now_iso, verify_chain
from chatstate.errors import CorruptTranscriptError, StoreUnavailable
from chatstate.stores.s3 import _doc as doc
from chatstate.stores.s3._transport import S3IO, Exists, Stale

SNAPSHOT_EVERY = 64


@dataclass
class IndexState:
    """The index object as read: ``doc`` None and ``exists`` True means unreadable."""

    doc: dict[str, Any] | None
    etag: str | None
    exists: bool

    def tail(self) -> tuple[int, str | None] | None:
        """(message count, last hash) when the index is usable as the stored tail."""
        if self.doc is None:
            return None
        count, last = self.doc["message_count"], self.doc["last_hash"]
        if count < 0 or (count > 0) != (last is not None):
            return None
        return count, last

    def shift(self) -> int:
        """The rewrites the head had seen (0 without an index)."""
        return int(self.doc.get("shift", 0)) if self.doc is not None else 0


class _Vanished(Exception):
    """Internal: an object listed was gone when read (a rewrite's superseded objects are
    removed after it; read again)."""


def read_chain(io: S3IO, pool: ThreadPoolExecutor, cid: str) -> tuple[list[Message], int]:
    """The newest snapshot plus every segment after it, chain verified; and the shift
    (the rewrites stored: the next append's slot is the message count plus it).

    Objects a rewrite superseded may be removed meanwhile (``S3Store.rewrite``): a gap,
    or an object gone when read, is fine before a rewrite segment, and a read that met
    one it could not pass over is made again once."""
    try:
        return _read_chain(io, pool, cid)
    except _Vanished:
        try:
            return _read_chain(io, pool, cid)
        except _Vanished as exc:
            raise StoreUnavailable(f"{exc} vanished while it was being read (the "
                                   "conversation is being deleted?); retry") from None


def _read_chain(io: S3IO, pool: ThreadPoolExecutor, cid: str) -> tuple[list[Message], int]:
    messages: list[Message] = []
    spans: list[tuple[int, str]] = []  # (first seq, key) to name the object at a position
    shift = 0
    snaps = io.keys(doc.snapshots_dir(cid))
    if snaps:
        key = snaps[-1][0]
        where = io.target.where(key)
        end = doc.seq_of(key, where)
        pending = pool.submit(io.get, key)  # overlaps the listing of the tail
        keys = [k for k, _ in io.keys(doc.segments_dir(cid), offset=doc.segment_key(cid, end))]
        snap = pending.result()
        if snap is None:
            raise _Vanished(where)
        messages, shift = doc.decode_snapshot(snap.data, where)
        if messages[-1].seq != end:
            raise CorruptTranscriptError(f"{where}: snapshot named after seq {end} ends at seq "
                                         f"{messages[-1].seq}; left as it is", where=where,
                                         position=min(end, messages[-1].seq))
        spans.append((0, key))
        keys = [k for k in keys if doc.seq_of(k, io.target.where(k)) > end + shift]
    else:
        keys = [k for k, _ in io.keys(doc.segments_dir(cid))]
    problem: Exception | None = None  # a gap, or an object gone: fine before a rewrite
    for key, blob in zip(keys, pool.map(io.get, keys), strict=True):
        where = io.target.where(key)
        slot = doc.seq_of(key, where)
        if blob is None:
            problem = problem or _Vanished(where)
            continue
        if problem is None and slot != len(messages) + shift:
            problem = CorruptTranscriptError(
                f"{where}: seq {len(messages)} is missing before this object (a segment was "
                "deleted or renamed); left as it is", where=where, position=len(messages))
        first = len(messages)
        found, rewrite = doc.decode_segment(blob.data, where, None if problem else first)
        if rewrite:  # the whole chain again: what came before is superseded
            assert found is not None
            again = slot - len(found) + 1  # its slot is its message count plus the shift
            if (problem is None and len(found) != first) or again <= shift:
                raise CorruptTranscriptError(
                    f"{where}: a rewrite of {len(found)} messages where {first} are stored "
                    "before it; left as it is", where=where, position=min(first, len(found)))
            messages, spans, shift, problem = found, [(0, key)], again, None
            continue
        if problem is None and found is not None:
            messages.extend(found)
            spans.append((first, key))
    if problem is not None:
        raise problem
    bad = verify_chain(messages)
    if bad is not None:
        key = [k for first, k in spans if first <= bad][-1]
        where = io.target.where(key)
        raise CorruptTranscriptError(
            f"{where}: hash chain broken at seq {bad} (a message was edited, removed or "
            "reordered); nothing was changed. Restore the object or quarantine the "
            "conversation with `chatstate repair`.", where=where, position=bad)
    return messages, shift


def check_head(io: S3IO, cid: str, messages: list[Message], state: IndexState,
               shift: int = 0) -> None:
    """Raise CorruptTranscriptError when ``messages`` fall short of the head the index records.

    The key named is the first missing segment's (segments partition the seqs, so
    the seq after the last stored message starts one). ``shift`` is the stored chain's: a
    head of a smaller one was replaced by a rewrite (same count, other hashes).
    """
    head = state.tail()
    if head is None:
        return  # no index (data from before the head was kept), or unreadable: no check
    count, last = head
    if count > len(messages):
        key = doc.segment_key(cid, len(messages))
        where = io.target.where(key)
        raise CorruptTranscriptError(
            f"{where}: missing: the conversation's head ({io.target.where(doc.index_key(cid))}) "
            f"records {count} messages, but only {len(messages)} are stored (a segment was "
            f"deleted from seq {len(messages)}); nothing was changed. Restore the object or "
            "quarantine the conversation with `chatstate repair`.", where=where,
            position=len(messages))
    if state.shift() > shift:
        where = io.target.where(doc.segments_dir(cid))
        raise CorruptTranscriptError(
            f"{where}: the conversation's head ({io.target.where(doc.index_key(cid))}) "
            f"records {state.shift()} rewrite(s), but only {shift} are stored (a rewrite "
            "segment was deleted); nothing was changed. Restore the objects or quarantine "
            "the conversation with `chatstate repair`.", where=where, position=len(messages))
    if count and state.shift() == shift and messages[count - 1].hash != last:
        key = doc.segment_key(cid, count - 1)
        where = io.target.where(doc.segments_dir(cid))
        raise CorruptTranscriptError(
            f"{where}: seq {count - 1} is not the message the conversation's head "
            f"({io.target.where(doc.index_key(cid))}) records (hash {str(last)[:12]}…); a "
            "segment was replaced. Nothing was changed. Restore the objects or quarantine "
            "the conversation with `chatstate repair`.", where=where, position=count - 1)


def read_against_head(io: S3IO, pool: ThreadPoolExecutor, cid: str,
                      state: IndexState | Future[IndexState]
                      ) -> tuple[list[Message], int, IndexState]:
    """``read_chain`` checked against the head; ``state`` may still be in flight.

    An index read in parallel with the listing may already hold another writer's
    append that the listing missed; so a shortfall is read again, index first
    (the index never runs ahead of the segments), before it is called corruption.
    """
    messages, shift = read_chain(io, pool, cid)
    head = state.result() if isinstance(state, Future) else state
    try:
        check_head(io, cid, messages, head, shift)
    except CorruptTranscriptError:
        if not isinstance(state, Future):
            raise
        head = get_index(io, cid)
        messages, shift = read_chain(io, pool, cid)
        check_head(io, cid, messages, head, shift)
    return messages, shift, head


def get_index(io: S3IO, cid: str) -> IndexState:
    key = doc.index_key(cid)
    blob = io.get(key)
    if blob is None:
        return IndexState(None, None, False)
    try:
        return IndexState(doc.decode_index(blob.data, io.target.where(key)), blob.etag, True)
    except CorruptTranscriptError:
        return IndexState(None, blob.etag, True)  # derived data: never overwritten, not fatal


def update_index(io: S3IO, cid: str, state: IndexState | None, header: dict[str, Any] | None,
                 *, tail: tuple[int, str | None] | None = None, shift: int = 0,
                 title: str | None = None, touch: bool = True) -> None:
    """Move the index forward by If-Match; give up quietly (load repairs) under contention.

    ``tail`` is (message count, last hash) and must end a segment of the chain of
    ``shift`` rewrites; the index never moves backward in (shift, count). ``header``
    supplies title and times when the index is missing.
    """
    for _ in range(5):
        state = state or get_index(io, cid)
        if state.exists and state.doc is None:
            return  # unreadable: leave it for `chatstate doctor`, never overwrite
        base = state.doc or _from_header(header)
        if base is None:
            return
        ahead = tail is not None and (shift, tail[0]) > \
            (int(base.get("shift", 0)), base["message_count"])
        if tail is not None and not ahead and title is None:
            return
        new = dict(base)
        if tail is not None and ahead:
            new.update(message_count=tail[0], last_hash=tail[1])
            if shift:
                new["shift"] = shift
        if title is not None:
            new["title"] = title
        if touch:
            new["updated_at"] = now_iso()
        new.pop("schema", None)
        try:
            io.put(doc.index_key(cid), doc.encode(new), create=not state.exists,
                   etag=state.etag, action="update the listing index")
            return
        except (Exists, Stale):
            state = None


def _from_header(header: dict[str, Any] | None) -> dict[str, Any] | None:
    if header is None:
        return None
    return {"id": header["id"], "title": header["title"], "created_at": header["created_at"],
            "updated_at": header["updated_at"], "message_count": 0, "last_hash": None}


def write_snapshot(io: S3IO, cid: str, messages: list[Message], shift: int = 0) -> None:
    """Snapshot ``messages`` (0..end of a segment of the chain of ``shift`` rewrites); an
    existing one is left alone."""
    with suppress(Exists):
        io.put(doc.snapshot_key(cid, messages[-1].seq),
               doc.encode_messages(cid, messages, shift=shift),
               create=True, action="write a snapshot")


def crosses_snapshot(first: int, last: int) -> bool:
    """Does the segment first..last contain a seq that ends a block of SNAPSHOT_EVERY?"""
    return (last + 1) // SNAPSHOT_EVERY > first // SNAPSHOT_EVERY
