"""``SealedStore``: the encrypted store (see ``chatstate.stores.sealed``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from chatstate._gcpause import paused
from chatstate.core.canonical import canonical_json, chain_hash
from chatstate.core.content import blob_area
from chatstate.core.transcript import Conversation, ConversationSummary, Message
from chatstate.errors import (
    ConflictError,
    ConversationNotFound,
    Unsupported,
)
from chatstate.stores import _b64 as b64
from chatstate.stores._mark import MARKER_ID
from chatstate.stores._mark import marker as marker  # the mark's reader, for the drill and tools
from chatstate.stores.base import (
    LEASE_TERM,
    CollectsBlobs,
    PreparedBatch,
    Searchable,
    Store,
    check_append,
    create_leased,
)
from chatstate.stores.codec import (
    BLOB_OVERHEAD,
    CHAINED,
    SEALED_BLOB_PART,
    SEALED_META,
    SEALED_PART,
    AeadCodec,
    binary_row,
    clear_fields,
)
from chatstate.stores.forwarding import ForwardingStore
from chatstate.stores.sealed._fast import FastReading
from chatstate.stores.sealed._reading import _Tail
from chatstate.stores.sealed._record import (
    _FIELDS,
    _ROW_END,
    _ROW_HEAD,
    _ROW_MID,
    _ROW_SEQ,
    _json_str,
    _Record,
)

HIDDEN = frozenset({MARKER_ID, "chatstate.search-index"})
"""The store's own conversations, hidden from callers: the mark, the keyed search index
(``chatstate.stores._keyed_index``)."""
MARKER_TITLE = ("chatstate: this store is encrypted; open it with its key set "
                "(CHATSTATE_ENCRYPTION_KEY, CHATSTATE_KEY_FILE or CHATSTATE_KEY_COMMAND)")



class SealedStore(FastReading, ForwardingStore):
    """``inner`` with every record sealed by ``codec`` (see the module docstring)."""

    def __init__(self, inner: Store, codec: AeadCodec) -> None:
        super().__init__(inner)
        self.codec = codec
        self._tails: dict[str, _Tail] = {}
        self._lock = threading.Lock()

    @classmethod
    def parts(cls, inner: Store) -> list[type]:
        return [p for p in super().parts(inner) if p is not Searchable]

    # -- naming ------------------------------------------------------------------------
    def _own(self, cid: str) -> str:
        if cid in HIDDEN:
            raise ConversationNotFound(f"{cid!r} is the encryption mark (or the keyed search "
                                       f"index) of {self.inner.url}, not a conversation")
        return cid

    # -- messages ----------------------------------------------------------------------
    def _seal(self, cid: str, msg: Message, prev_stored: str | None,
              prev: str | None, body: str | None = None, *, checked: bool = False) -> Message:
        """``msg`` as stored: sealed (format 2, its plaintext chain hash inside), bound to
        (cid, seq, ``prev``: the plaintext chain hash before it), chained from
        ``prev_stored`` (the stored hash before it). ``body``: ``msg.body()``, when the
        caller has it already; ``checked``: the caller has checked that ``msg.hash`` is
        the chain hash of ``prev`` and the body (``check_append``), else it is made here."""
        text = msg.body() if body is None else body
        digest = msg.hash if checked else chain_hash(prev, text)
        raw = self.codec.seal_chained("message", cid, msg.seq,
                                      text.encode("utf-8", "surrogatepass"), prev, digest)
        data = b64.encode_text(raw)
        refs = msg.blob_refs()
        if not refs:  # the common record: its canonical body written out, not dumped
            # (the inner store checks the hash against ``body()`` again, so a mismatch
            # could only ever be refused, never stored)
            created, status = _json_str(msg.created_at), _json_str(msg.status)
            stored = (_ROW_HEAD + data + _ROW_MID + created + _ROW_SEQ + str(msg.seq) +
                      ',"status":' + status + _ROW_END)
            values = dict(_FIELDS)  # the fields as ``Message`` checks them, all known good
            values.update(seq=msg.seq, content=[{"type": SEALED_PART, "data": data,
                                                 "v": CHAINED}],
                          created_at=msg.created_at, status=msg.status,
                          hash=chain_hash(prev_stored, stored))
            record = _Record._from_values(values)
            object.__setattr__(record, "_canonical", stored)  # frozen: its slots
            object.__setattr__(record, "_after", prev_stored)  # its hash's link, made here
            object.__setattr__(record, "_binary", binary_row(clear_fields(
                created.encode("utf-8", "surrogatepass"),
                status.encode("utf-8", "surrogatepass")), raw))
            return record
        parts: list[dict[str, Any]] = [{"type": SEALED_PART, "data": data, "v": CHAINED}]
        for ref in refs:
            size = ref.get("size")
            parts.append({"type": SEALED_BLOB_PART, "blob": {
                "sha256": ref.get("sha256"),
                "size": size + BLOB_OVERHEAD if isinstance(size, int) else size}})
        sealed = Message(seq=msg.seq, role="event", content=parts, created_at=msg.created_at,
                         turn_id="sealed", status=msg.status)
        return sealed.model_copy(update={"hash": chain_hash(prev_stored, sealed.body())})

    # -- header ------------------------------------------------------------------------
    def _seal_title(self, cid: str, title: str) -> str:
        return self.codec.seal_text("title", cid, None, title)

    def _seal_metadata(self, cid: str, metadata: dict[str, Any]) -> dict[str, Any]:
        return {SEALED_META: self.codec.seal_text("metadata", cid, None,
                                                  canonical_json(metadata))}

    # -- the contract ------------------------------------------------------------------
    def create(self, conversation: Conversation) -> None:
        cid = self._own(conversation.id)
        self.inner.create(conversation.model_copy(update={
            "title": self._seal_title(cid, conversation.title),
            "metadata": self._seal_metadata(cid, conversation.metadata)}))
        with self._lock:
            self._tails[cid] = (0, None, None)

    def create_leased(self, conversation: Conversation, messages: Sequence[Message], *,
                      owner: str | None = None, term: float = LEASE_TERM,
                      wait: float = 0.0) -> Any:
        """The header and the first messages sealed, then the inner store's one write."""
        cid = self._own(conversation.id)
        check_append(self._at(cid), -1, lambda seq: "", messages)
        sealed: list[Message] = []
        prev: str | None = None
        logical: str | None = None
        for msg in messages:  # their chain checked just above
            sealed.append(self._seal(cid, msg, prev, logical, checked=True))
            prev, logical = sealed[-1].hash, msg.hash
        with self._lock:
            self._tails.pop(cid, None)
        lease = create_leased(self.inner, conversation.model_copy(update={
            "title": self._seal_title(cid, conversation.title),
            "metadata": self._seal_metadata(cid, conversation.metadata)}), sealed,
            owner=owner, term=term, wait=wait)
        with self._lock:
            self._tails[cid] = (len(sealed), prev, logical)
        return lease

    def load(self, conversation_id: str) -> Conversation:
        """The conversation opened: every record's tag checked (the chain over the stored
        bytes is not hashed again where ``_keyed_load`` can open every row; see there).
        ``verified_load`` verifies that chain too."""
        return self._load(self._own(conversation_id), stored_chain=False)

    def verified_load(self, conversation_id: str) -> Conversation:
        """``load``, the chain over the stored bytes verified too (as a keyless check does):
        ``replay --verify`` and ``doctor`` with the key."""
        return self._load(self._own(conversation_id), stored_chain=True)

    def _load(self, cid: str, stored_chain: bool) -> Conversation:
        with paused():  # the records opened and made are many, and none in a cycle
            return self._opened(cid, stored_chain)

    def _opened(self, cid: str, stored_chain: bool) -> Conversation:
        fast = None if stored_chain else self._keyed_load(cid)
        if fast is None:
            fast = self._fast_load(cid)
        if fast is not None:
            return fast
        stored = self.inner.load(cid)
        messages = self._open_chain(cid, stored.messages)
        last = messages[-1].hash if messages else None
        partial = None if stored.partial is None else \
            self._open_partial(cid, stored.partial, last)
        with self._lock:
            self._tails[cid] = (len(messages), stored.messages[-1].hash if messages else None,
                                last)
        return Conversation.model_construct(
            id=stored.id, title=self._open_title(cid, stored.title),
            created_at=stored.created_at, updated_at=stored.updated_at,
            metadata=self._open_metadata(cid, stored.metadata), messages=messages,
            partial=partial)

    def list_conversations(self, limit: int | None = None) -> list[ConversationSummary]:
        found = [s for s in self.inner.list_conversations(None if limit is None else
                                                          limit + len(HIDDEN))
                 if s.id not in HIDDEN]
        return [s.model_copy(update={"title": self._open_title(s.id, s.title)})
                for s in found[:limit]]

    def delete(self, conversation_id: str) -> None:
        cid = self._own(conversation_id)
        with self._lock:
            self._tails.pop(cid, None)
        self.inner.delete(cid)

    def _tail(self, cid: str, fresh: bool = False) -> _Tail:
        with self._lock:
            tail = None if fresh else self._tails.get(cid)
        if tail is None:
            self.load(cid)
            with self._lock:
                tail = self._tails[cid]
        return tail

    def _logical_hashes(self, cid: str) -> list[str]:
        return [m.hash for m in self.load(cid).messages]

    def append(self, conversation_id: str, messages: Sequence[Message], *,
               fence: str | None = None) -> None:
        cid = self._own(conversation_id)
        if not messages:
            self.inner.append(cid, [], **({} if fence is None else {"fence": fence}))
            return
        prepared = PreparedBatch(messages)  # each body made once: checked, then sealed
        for attempt in (0, 1):
            count, stored_last, last = self._tail(cid, fresh=attempt == 1)
            every: list[str] | None = None

            def hash_at(seq: int, count: int = count, last: str | None = last) -> str:
                nonlocal every
                if seq == count - 1:
                    return last or ""
                if every is None:
                    every = self._logical_hashes(cid)
                return every[seq] if seq < len(every) else ""

            try:
                already = check_append(self._at(cid), count - 1, hash_at,
                                       prepared.messages, prepared)
            except ConflictError:
                if attempt == 0:
                    continue  # what this process knew may be stale: look again
                raise
            fresh = prepared.messages[already:]
            if not fresh:
                return
            sealed: list[Message] = []
            prev, logical = stored_last, last
            for msg, body in zip(fresh, prepared.bodies[already:], strict=True):
                sealed.append(self._seal(cid, msg, prev, logical, body, checked=True))
                prev, logical = sealed[-1].hash, msg.hash
            try:
                self.inner.append(cid, sealed, **({} if fence is None else {"fence": fence}))
            except ConflictError:
                with self._lock:
                    self._tails.pop(cid, None)
                if attempt == 0:  # the stored chain moved under the same plaintext (a
                    continue      # rekey rewrote it): seal again from what is stored now
                raise
            except BaseException:
                with self._lock:
                    self._tails.pop(cid, None)
                raise
            break
        with self._lock:
            self._tails[cid] = (fresh[-1].seq + 1, prev, fresh[-1].hash)

    def save_partial(self, conversation_id: str, partial: Message, *,
                     fence: str | None = None) -> None:
        cid = self._own(conversation_id)
        count, stored_last, last = self._tail(cid)
        if partial.seq != count:
            count, stored_last, last = self._tail(cid, fresh=True)
        self.inner.save_partial(cid, self._seal(cid, partial, stored_last, last),
                                **({} if fence is None else {"fence": fence}))

    def clear_partial(self, conversation_id: str, *, fence: str | None = None) -> None:
        self.inner.clear_partial(self._own(conversation_id),
                                 **({} if fence is None else {"fence": fence}))

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None, fence: str | None = None) -> None:
        cid = self._own(conversation_id)
        self.inner.set_header(
            cid, title=None if title is None else self._seal_title(cid, title),
            metadata=None if metadata is None else self._seal_metadata(cid, metadata),
            **({} if fence is None else {"fence": fence}))

    def search(self, text: str, limit: int = 50) -> list[tuple[str, int, str]]:
        """Off, unless opted in to a keyed index (``chatstate.stores._keyed_index``)."""
        from chatstate.stores import _keyed_index

        if not _keyed_index.enabled():
            raise _keyed_index.refused(self.inner.url)
        return _keyed_index.KeyedIndex(self).search(text, limit)

    # -- blobs -------------------------------------------------------------------------
    def put_blob(self, data: bytes, *, media_type: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        ref = blob_area(self.inner, "images and files").put_blob(self.codec.seal_blob(data))
        out: dict[str, Any] = {"sha256": ref["sha256"], "size": len(data)}
        if media_type:
            out["media_type"] = media_type
        if name:
            out["name"] = name
        return out

    def get_blob(self, sha256: str) -> bytes:
        stored = blob_area(self.inner, "images and files").get_blob(sha256)
        return self.codec.open_blob(stored, f"{self.inner.url}: blob {sha256}")

    def has_blob(self, sha256: str) -> bool:
        return blob_area(self.inner, "images and files").has_blob(sha256)

    def list_blobs(self) -> list[tuple[str, int, float]]:
        """(address, plaintext size, age): the sizes the references record."""
        return [(sha, max(size - BLOB_OVERHEAD, 0), age)
                for sha, size, age in self._collector().list_blobs()]

    def remove_blob(self, sha256: str, *, idle_for: float) -> bool:
        return self._collector().remove_blob(sha256, idle_for=idle_for)

    def _collector(self) -> CollectsBlobs:
        if not isinstance(self.inner, CollectsBlobs):
            raise Unsupported(f"{self.inner.url}: this store cannot list or remove blobs")
        return self.inner


