"""The s3 store: conversations in any S3-compatible bucket, compare-and-append by conditional PUT.

Layout under ``s3://bucket/prefix/``::

    chatstate.json                       store marker (schema version)
    conversations/<id>/header.json       id, title, created_at, updated_at, metadata
    conversations/<id>/m/<slot>.json     one segment per append, If-None-Match: *
                                         (or a rewrite of them all: ``rewrite``)
    conversations/<id>/snap/<seq>.json   messages 0..seq, every SNAPSHOT_EVERY messages
    conversations/<id>/partial.json      the in-progress reply, replaced with If-Match
    index/<id>.json                      listing summary, moved forward with If-Match
    _opens/<time>-<rand>.json            one object per open (boot id, host, DEPLOY_ID)
    _leases/<id>.json                    the writer lease (owner token, host, pid, until)
    _probe/…                             check()'s probe object, deleted after use
    blobs/<sha256>                       images and files named by messages (_s3blobs)

``<seq>`` is zero-padded to 10 digits, and so is ``<slot>``: a segment's first seq plus
the rewrites before it (so its seq in a conversation never rewritten). See ``_chain``
for why segments, snapshots and the index keep compare-and-append exact without a
lock service, and how a rewrite stays one conditional PUT.

Requests (steady state, pinned by tests/contract/test_s3_store.py::test_request_cost_per_turn):
appending one message is 3 sequential requests (GET index, PUT segment, PUT index),
plus a DELETE of the partial reply this store streamed for it (overlapping the
index PUT). A streamed reply's first flush is 2 (GET index, PUT), each later
flush 1 PUT. One user+assistant turn is 6 requests unstreamed, N + 8 with the
reply streamed in N flushes; every SNAPSHOT_EVERY (64) messages one more PUT
writes a snapshot. A fenced write (``fence=``) adds one GET of the lease object
(``_leases/<id>.json``), overlapping the index read where there is one. Loading
is 5 requests (6 once a snapshot exists) plus one GET per segment after the
newest snapshot, in 3 round trips; listing is 2 LISTs plus
one GET of a small index object per conversation, in parallel. A write onto a
conversation this process has neither created nor loaded first reads and
verifies its chain (a load's worth of requests, once): nothing is written onto
a chain that does not verify or falls short of the head the index records.

The store assumes what AWS S3, MinIO, R2 and SeaweedFS give: strong read-after-write
and list-after-write consistency, and conditional PUTs (If-None-Match: *, If-Match).
The conditional PUTs it proves before it writes (``_server``: once per process per
endpoint and bucket at open, 4 requests and a delete; every ``check()``), and refuses
a server, or a proxy, that drops them.

An append is committed when its segment is: a failure of what follows (the index,
the delete of the partial reply it kept, a snapshot) is logged and repaired by the
next load or append, never reported as a failed append of a stored message.

A write is acknowledged by the object store before a method returns. The
partial reply is flushed at most every ``partial_flush_interval`` seconds by
the session (a flush is a network round trip; rendering waits for it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from chatstate.core.transcript import (
    Conversation,
    ConversationSummary,
    Message,
    now_iso,
    validate_id,
)
from chatstate.errors import (
    ConflictError,
    ConversationNotFound,
    CorruptTranscriptError,
    StoreUnavailable,
)
from chatstate.stores.base import check_append, check_partial_commit, check_rewrite
from chatstate.stores.blobs import check_stored_blobs, named_blobs, refuse_unheld_blobs
from chatstate.stores.s3 import _chain as chain
from chatstate.stores.s3 import _doc as doc
from chatstate.stores.s3._blobs import S3Blobs
from chatstate.stores.s3._lease import S3Lease
from chatstate.stores.s3._transport import Exists, S3Target, Stale, parse_url

log = logging.getLogger("chatstate.stores")


@dataclass
class _Partial:
    seq: int
    etag: str | None
    attempt: bytes  # the last body we tried to put, to recognise our own unknown outcome


class S3Store(S3Lease, S3Blobs):
    """Conversations in an S3-compatible bucket. See the module docstring."""

    def __init__(self, target: S3Target, url: str) -> None:
        super().__init__(target, url)
        self._partials: dict[str, _Partial] = {}

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        """Parse the URL (no I/O); credentials in it are refused."""
        return cls(parse_url(url), url)

    def close(self) -> None:
        super().close()
        self._partials.clear()

    # -- reads -----------------------------------------------------------------------
    def load(self, conversation_id: str) -> Conversation:
        cid = validate_id(conversation_id)
        index = self.pool.submit(chain.get_index, self.io, cid)
        partial_blob = self.pool.submit(self.io.get, doc.partial_key(cid))
        pending = self.pool.submit(self._header, cid)
        messages, shift, state = chain.read_against_head(self.io, self.pool, cid, index)
        header = pending.result()
        self._remember(cid, messages, shift)
        if state.doc is None or state.doc["message_count"] < len(messages) or \
                state.shift() < shift:
            tail = (len(messages), messages[-1].hash if messages else None)
            chain.update_index(self.io, cid, state, header, tail=tail, shift=shift,
                               touch=False)
        partial = None
        blob = partial_blob.result()
        if blob is not None:
            candidate = doc.decode_partial(blob.data, self._where(doc.partial_key(cid)))
            if candidate.seq == len(messages):
                partial = candidate
        named = [*messages, *([partial] if partial else [])]
        sizes = self._blob_sizes(list(named_blobs(named)))
        check_stored_blobs(self._where(doc.conv_dir(cid)), named, sizes.get, self._blob_where)
        times = [header["updated_at"]] + ([messages[-1].created_at] if messages else [])
        if state.doc is not None:
            times.append(state.doc["updated_at"])
        return Conversation.model_construct(
            id=cid, title=header["title"], created_at=header["created_at"],
            updated_at=max(times), metadata=header["metadata"], messages=messages,
            partial=partial)

    def list_conversations(self, limit: int | None = None) -> list[ConversationSummary]:
        indexed = {k[len(doc.INDEX) + 1:-5] for k, _ in self.io.keys(doc.INDEX)}
        ids = self.io.dirs(doc.CONVERSATIONS)
        states: dict[str, chain.IndexState | None] = dict(zip(ids, self.pool.map(
            lambda c: chain.get_index(self.io, c) if c in indexed else None, ids), strict=True))
        out = []
        for cid in ids:
            state = states[cid]
            if state is not None and state.doc is not None:
                d = state.doc
                out.append(ConversationSummary(
                    id=cid, title=d["title"], created_at=d["created_at"],
                    updated_at=d["updated_at"], message_count=d["message_count"]))
                continue
            try:
                out.append(self.load(cid).summary())  # no usable index: load repairs it
            except ConversationNotFound:
                continue  # half-created or half-deleted: no header
            except CorruptTranscriptError:
                out.append(ConversationSummary(id=cid, title="(unreadable: run `chatstate "
                           "doctor`)", created_at="", updated_at="", message_count=0))
        out.sort(key=lambda s: (s.updated_at, s.id), reverse=True)
        return out[:limit] if limit is not None else out

    # -- writes ----------------------------------------------------------------------
    def create(self, conversation: Conversation) -> None:
        cid = validate_id(conversation.id)
        if conversation.messages:
            raise ValueError("create() takes an empty conversation; append the messages")
        header = conversation.header()
        try:
            self.io.put(doc.header_key(cid), doc.encode(header), create=True,
                        action="create a conversation at")
        except Exists:
            raise ConflictError(f"conversation {cid!r} already exists in {self.url}") from None
        self._remember(cid, [], 0)  # the header was created just now: no segment precedes it
        chain.update_index(self.io, cid, chain.IndexState(None, None, False), header,
                           touch=False)

    def append(self, conversation_id: str, messages: Sequence[Message], *,
               fence: str | None = None) -> None:
        cid = validate_id(conversation_id)
        new = list(messages)
        if not new:
            self._check_fence(cid, fence)
            self._header(cid)
            return
        where = self._where(doc.conv_dir(cid))
        fenced = self._fence_started(cid, fence)
        state = chain.get_index(self.io, cid)
        stored = self._verified(cid, state)  # never onto a chain that does not verify
        fenced()
        for _ in range(4):
            shift = self._shift(cid)
            hashes = [m.hash for m in stored]
            already = check_append(where, len(hashes) - 1, hashes.__getitem__, new)
            fresh = new[already:]
            refuse_unheld_blobs(where, fresh, self._blob_size)
            if fresh and fresh[0].status == "partial":
                self._claim_partial(cid, where, fresh)
            if not fresh or self._put_segment(cid, fresh, shift):
                break
            # another writer (or our own lost attempt) took the slot, or a rewrite did (its
            # chain has other stored hashes: check_append then raises ConflictError)
            stored = self._authoritative(cid)
        else:
            raise ConflictError(f"{where}: other writers kept taking seq {new[0].seq}; reload "
                                "and retry", expected_seq=new[0].seq - 1)
        self._after_append(cid, state, fresh, stored, shift)

    def _fence_started(self, cid: str, fence: str | None) -> Callable[[], None]:
        """Start reading the lease (it overlaps the caller's next request); the result
        waits for it and raises LeaseLost."""
        if fence is None:
            return lambda: None
        return self.pool.submit(self._check_fence, cid, fence).result

    def _claim_partial(self, cid: str, where: str, fresh: list[Message]) -> None:
        """Before keeping a partial reply in the chain, take it from whoever streams it.

        The stored partial must be the one being kept (check_partial_commit), and it
        is rewritten with If-Match as claimed: a live writer's next flush then fails
        its own If-Match and it stops before showing text that would not be kept.
        """
        key = doc.partial_key(cid)
        blob = self.io.get(key)
        if blob is None:
            return
        held = doc.decode_partial(blob.data, self._where(key))
        check_partial_commit(where, fresh, held)
        if held.seq != fresh[0].seq:
            return
        try:
            self.io.put(key, doc.encode_partial(cid, held, claimed=True), etag=blob.etag,
                        create=blob.etag is None, action="claim the partial reply at")
        except (Stale, Exists):
            raise ConflictError(f"{self._where(key)}: the partial reply changed while it was "
                                "being kept (another writer is still streaming it); reload "
                                "and retry", expected_seq=fresh[0].seq - 1) from None

    def _put_segment(self, cid: str, fresh: list[Message], shift: int) -> bool:
        try:
            self.io.put(doc.segment_key(cid, fresh[0].seq + shift),
                        doc.encode_messages(cid, fresh), create=True, action="append to")
            return True
        except Exists:
            return False

    def _after_append(self, cid: str, state: chain.IndexState, fresh: list[Message],
                      stored: list[Message], shift: int) -> None:
        if fresh:
            end = fresh[-1]
            cached = self._chains.get(cid)
            prev = cached[-1].hash if cached else None
            if cached is not None and len(cached) == fresh[0].seq and \
                    self._shifts.get(cid) == shift and \
                    fresh[0].expected_hash(prev) == fresh[0].hash:
                self._chains[cid] = cached + fresh
            else:
                self._forget(cid)
            tail = (end.seq + 1, end.hash)
        elif stored:
            end, tail = stored[-1], (len(stored), stored[-1].hash)
        else:
            return
        # the segment is the commit point: what follows is derived data, and a failure
        # there is logged and repaired later (load and the next append move the index
        # forward; a stale partial of a stored seq is ignored and replaced), never
        # reported as a failed append of a message that is stored
        mine = self._partials.get(cid)
        cleared = None
        if mine is not None and mine.seq <= end.seq:  # overlaps the index update
            cleared = self.pool.submit(self.io.delete, [doc.partial_key(cid)],
                                       "clear the partial reply at")
            self._partials.pop(cid, None)

        def index() -> None:
            header = None if state.exists else self._header(cid)
            chain.update_index(self.io, cid, state, header, tail=tail, shift=shift)

        self._derived(cid, "move the listing index forward", index)
        if cleared is not None:
            self._derived(cid, "delete the partial reply it kept", cleared.result)
        if fresh and chain.crosses_snapshot(fresh[0].seq, end.seq):
            self._derived(cid, "write a snapshot", lambda: self._snapshot(cid, end, shift))

    def _derived(self, cid: str, what: str, step: Callable[[], object],
                 done: str = "the append",
                 later: str = "repaired at the next load or append") -> None:
        try:
            step()
        except StoreUnavailable as exc:
            log.warning("%s: %s is stored, but could not %s (%s): %s",
                        self._where(doc.conv_dir(cid)), done, what, later, exc)

    def _snapshot(self, cid: str, end: Message, shift: int) -> None:
        cached = self._chains.get(cid)
        if cached is None or len(cached) <= end.seq or cached[end.seq].hash != end.hash or \
                self._shifts.get(cid) != shift:
            cached = self._authoritative(cid)
        if len(cached) > end.seq and cached[end.seq].hash == end.hash and \
                self._shift(cid) == shift:  # (not when a rewrite came after the append)
            chain.write_snapshot(self.io, cid, cached[:end.seq + 1], shift)

    def rewrite(self, conversation_id: str, messages: Sequence[Message], *,
                expect: str | None) -> None:
        """Every stored message replaced at once (``Rewrites``: ``chatstate rekey``).

        One create-only PUT (If-None-Match: *) of a rewrite segment holding the whole
        chain again, at the slot the next append would take (see ``_chain``): an append
        that got there first makes it conflict, one that comes after finds the rewritten
        chain. Made only against the chain as read from the objects now, whose last
        stored hash is ``expect`` (``check_rewrite``); blobs the messages name must be
        stored first. The index is moved to the new head after it, and the objects it
        superseded are removed (derived data, as after an append).
        """
        cid = validate_id(conversation_id)
        where = self._where(doc.conv_dir(cid))
        state = chain.get_index(self.io, cid)
        stored = self._authoritative(cid, state)
        shift = self._shift(cid)
        check_rewrite(where, len(stored), stored[-1].hash if stored else None, expect,
                      messages)
        fresh = list(messages)
        if [m.hash for m in fresh] == [m.hash for m in stored]:
            return  # nothing to rewrite (and no message at all: no slot to take)
        refuse_unheld_blobs(where, fresh, self._blob_size)
        key, data = doc.segment_key(cid, len(stored) + shift), \
            doc.encode_rewrite(cid, fresh, expect)
        try:
            self.io.put(key, data, create=True, action="rewrite")
        except Exists:
            got = self.io.get(key)
            if got is None or got.data != data:  # not our own write whose answer was lost
                self._forget(cid)
                raise ConflictError(f"{where}: changed since it was read for the rewrite "
                                    "(another writer appended); nothing was rewritten, read "
                                    "it again", expected_seq=len(fresh) - 1) from None
        self._remember(cid, fresh, shift + 1)
        tail = (len(fresh), fresh[-1].hash)

        def index() -> None:
            header = None if state.exists else self._header(cid)
            chain.update_index(self.io, cid, None, header, tail=tail, shift=shift + 1,
                               touch=False)

        self._derived(cid, "move the listing index to the rewritten chain", index,
                      "the rewrite")
        self._derived(cid, "remove the objects it superseded",
                      lambda: self._remove_superseded(cid, len(stored) + shift, len(fresh)),
                      "the rewrite", "never read again; a later rekey in place removes them")

    def remove_superseded(self, conversation_id: str) -> int:
        """What a rewrite superseded and a kill left (before ``rewrite`` removed it):
        removed; how many objects. ``chatstate rekey`` calls it on each conversation it
        holds, so a rerun after such a kill leaves no record of the old key behind."""
        cid = validate_id(conversation_id)
        shift = self._shifts.get(cid)
        if shift is None:
            shift = chain.get_index(self.io, cid).shift()
        if not shift:
            return 0  # never rewritten (as this process, or the head, last read it)
        keys = [k for k, _ in self.io.keys(doc.segments_dir(cid))]
        for key in reversed(keys):  # the last rewrite: after it, only the appends since
            blob = self.io.get(key)
            if blob is None:
                continue
            found, rewrite = doc.decode_segment(blob.data, self._where(key), None)
            if rewrite and found is not None:
                return self._remove_superseded(cid, doc.seq_of(key, self._where(key)),
                                               len(found))
        return 0

    def _remove_superseded(self, cid: str, slot: int, count: int) -> int:
        """After a rewrite at ``slot`` of ``count`` messages: the snapshots and segments
        before it (the old chain's records: under the old key, for rekey), never read as
        the chain again; how many. Snapshots of later seqs (of appends after it) stay."""
        def before(sub: str, end: int) -> list[str]:
            out = []
            for key, _ in self.io.keys(sub):
                with suppress(CorruptTranscriptError):  # not <seq>.json: not ours to remove
                    if doc.seq_of(key, self._where(key)) < end:
                        out.append(key)
            return out

        gone = before(doc.snapshots_dir(cid), count) + before(doc.segments_dir(cid), slot)
        self.io.delete(gone, "remove a superseded object at")
        return len(gone)

    def save_partial(self, conversation_id: str, partial: Message, *,
                     fence: str | None = None) -> None:
        """Create or replace the partial object, conditionally on what this writer saw.

        Every PUT is conditional: If-None-Match when this writer has written no partial
        for this seq, If-Match on the e-tag of the one it last wrote. On a mismatch, its
        own write whose answer was lost is recognised by its bytes. Anything else is
        another writer's: on the first save of a seq, a partial left by a writer that
        is gone (it died, or lost the lease to this one) is replaced; later, another
        writer has replaced ours (a second streamer, or an append keeping it in the
        chain claimed it): ConflictError. With ``fence`` the lease object is read
        before the PUT and again on a mismatch, so a writer that lost its lease gets
        LeaseLost and never creates or replaces the partial of the one that took over.
        """
        cid = validate_id(conversation_id)
        key, data = doc.partial_key(cid), doc.encode_partial(cid, partial)
        mine = self._partials.get(cid)
        first = mine is None or mine.seq != partial.seq or mine.etag is None
        if mine is not None and not first:
            self._check_fence(cid, fence)
        else:
            fenced = self._fence_started(cid, fence)
            self._expect_next(cid, partial.seq)
            fenced()
            mine = self._partials[cid] = _Partial(partial.seq, None, data)
        mine.attempt, previous = data, mine.attempt
        etag = mine.etag
        for attempt in range(4):
            try:
                mine.etag = self.io.put(key, data, etag=etag, create=etag is None,
                                        action="save the partial reply")
                return
            except (Stale, Exists):
                current = self.io.get(key)
            if current is not None and current.data in (previous, data):
                etag = mine.etag = current.etag  # our own write whose answer was lost
                continue
            self._check_fence(cid, fence)  # LeaseLost when another writer took over
            if not first or (fence is None and attempt > 0):
                break
            etag = current.etag if current is not None else None  # a gone writer's
        self._partials.pop(cid, None)
        raise ConflictError(f"{self._where(key)}: another writer replaced this partial reply; "
                            "two writers are streaming into one conversation. Reload.")

    def _expect_next(self, cid: str, seq: int) -> None:
        count = len(self._verified(cid, chain.get_index(self.io, cid)))
        if seq != count:
            raise ConflictError(f"{self._where(doc.conv_dir(cid))}: partial reply for seq "
                                f"{seq}, but the next seq is {count}",
                                expected_seq=seq - 1, actual_seq=count - 1)

    def clear_partial(self, conversation_id: str, *, fence: str | None = None) -> None:
        cid = validate_id(conversation_id)
        # no conditional DELETE (S3 offers none through obstore): a fenced clear reads
        # the lease just before it
        self._check_fence(cid, fence)
        self.io.delete([doc.partial_key(cid)], "clear the partial reply at")
        self._partials.pop(cid, None)

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None, fence: str | None = None) -> None:
        cid = validate_id(conversation_id)
        key = doc.header_key(cid)
        fenced = self._fence_started(cid, fence)
        state = chain.get_index(self.io, cid)
        self._verified(cid, state)  # never onto a chain that does not verify
        fenced()
        for attempt in range(5):
            if attempt:  # changed under us: by a writer that took the conversation over?
                self._check_fence(cid, fence)
            blob = self.io.get(key)
            if blob is None:
                raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
            header = doc.decode_header(blob.data, self._where(key), cid)
            header["updated_at"] = now_iso()
            if title is not None:
                header["title"] = title
            if metadata is not None:
                header["metadata"] = metadata
            try:
                self.io.put(key, doc.encode(header), etag=blob.etag, action="update")
                break
            except Stale:
                continue
        else:
            raise ConflictError(f"{self._where(key)}: changed by other writers 5 times in a "
                                "row; retry")
        chain.update_index(self.io, cid, state, header, title=title)

    def quarantine(self, conversation_id: str) -> str:
        """Copy a (damaged) conversation aside under quarantine/, then remove it."""
        from chatstate.stores.s3._repair import quarantine

        cid = validate_id(conversation_id)
        self._forget(cid)
        return quarantine(self.io, cid, self.url)

    def leftovers(self, conversation_ids: Sequence[str],
                  counts: Mapping[str, int]) -> list[str]:
        """Objects outside the layout or beyond the stored chain (ReportsLeftovers)."""
        from chatstate.stores.s3._leftovers import s3_leftovers

        def shift(cid: str) -> int:  # as this process last read the chain (the caller
            cached = self._shifts.get(cid)  # loaded it for ``counts``), else read now
            if cached is not None:
                return cached
            try:
                return chain.read_chain(self.io, self.pool, cid)[1]
            except CorruptTranscriptError:
                return 0  # (named by the load that reads it)

        return s3_leftovers(self.io, conversation_ids, counts,
                            dict(zip(conversation_ids, self.pool.map(shift, conversation_ids),
                                     strict=True)))

    def delete(self, conversation_id: str) -> None:
        cid = validate_id(conversation_id)
        self._header(cid)
        # index first (drops out of listings), header last (create() of the same id stays
        # refused until everything is gone, so no new chain can inherit old segments);
        # an interrupted delete is finished by running it again
        self.io.delete([doc.index_key(cid), doc.partial_key(cid)])
        for sub in (doc.snapshots_dir(cid), doc.segments_dir(cid)):
            self.io.delete([k for k, _ in reversed(self.io.keys(sub))])
        self.io.delete([doc.header_key(cid)])
        self._forget(cid)
        self._partials.pop(cid, None)

