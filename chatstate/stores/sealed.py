"""An encrypted store: every store, sealed at its record boundary by the AEAD codec.

``open_store`` wraps the store it opened in ``SealedStore`` when a key is
configured (``chatstate.stores.keys``), so json, sqlite, s3, postgresql, memory
and third-party stores are encrypted by this one module, and each keeps its own
layout, compare-and-append, leases and crash recovery unchanged.

What the store holds for a message is itself a valid message: the seq, status
and time in the clear, role ``event``, and as content one ``chatstate.sealed``
part (``"v":2``: the real message's plaintext chain hash and canonical JSON, sealed;
associated data: kind, conversation id, seq, the chain hash before it; a part without
``v`` is format 1, the canonical JSON alone, still read) plus one ``chatstate.blob``
part per blob it names (the
sealed blob's keyed address and size, so the store's blob checks and ``gc`` see
them). The store chains its hashes over those stored bodies, so its chain, and
``replay --verify`` and ``doctor`` without the key, check the ciphertext; the
caller sees the real messages, whose hashes are today's chain over their
plaintext bodies: carried in each record's authenticated plaintext (format 2; the
sealer checked each against its body before sealing it), or recomputed from the bodies
(format 1). ``replay --verify`` with the key recomputes them all.

A title and the metadata are sealed too (kinds ``title`` and ``metadata``). A
blob is sealed with a nonce derived from its bytes, so its address (the sha256
of the sealed bytes, checkable without the key) is a keyed digest: equal files
are stored once under one key, and nobody without the key can confirm a guess.

The store is marked encrypted by a conversation named ``chatstate.encryption``
(its title says so, its metadata names the AEAD and the key's fingerprint),
hidden from callers here; a store with the mark refuses to open without a key.
"""

from __future__ import annotations

import binascii
import contextlib
import hashlib
import json
import threading
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Literal

import orjson

from chatstate.core.canonical import canonical_json, chain_hash
from chatstate.core.content import blob_area
from chatstate.core.transcript import Conversation, ConversationSummary, Message
from chatstate.errors import (
    ConfigurationError,
    ConflictError,
    ConversationNotFound,
    CorruptTranscriptError,
    Unsupported,
)
from chatstate.stores._fastload import stored_messages, validate_json_array
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
    AEAD_GCM_SIV,
    AEAD_NAME,
    BINARY_ROW,
    BLOB_OVERHEAD,
    CHAINED,
    FP_BYTES,
    NONCE_BYTES,
    ROW_END,
    ROW_HEAD,
    ROW_MID,
    ROW_SEQ,
    ROW_TAIL,
    ROW_TAIL_V1,
    SEALED_BLOB_PART,
    SEALED_META,
    SEALED_PART,
    AeadCodec,
    binary_row,
    clear_fields,
    expand_row,
    is_binary_row,
)
from chatstate.stores.forwarding import ForwardingStore

HIDDEN = frozenset({MARKER_ID, "chatstate.search-index"})
"""The store's own conversations, hidden from callers: the mark, the keyed search index
(``chatstate.stores._keyed_index``)."""
MARKER_TITLE = ("chatstate: this store is encrypted; open it with its key set "
                "(CHATSTATE_ENCRYPTION_KEY, CHATSTATE_KEY_FILE or CHATSTATE_KEY_COMMAND)")

_Tail = tuple[int, str | None, str | None]
"""(message count, stored hash of the last message, its plaintext chain hash)"""


_ROW_HEAD = ROW_HEAD.decode()
_ROW_MID = ROW_MID.decode()
_ROW_SEQ = ROW_SEQ.decode()
_ROW_END = ROW_END.decode()
"""``codec``'s row pieces as text, for ``_seal``, which makes the canonical body."""
_json_str = json.JSONEncoder(ensure_ascii=False).encode
"""A string as ``canonical_json`` writes it."""
_HEAD = FP_BYTES + NONCE_BYTES
"""Where the ciphertext of a sealed record starts (after the key's fingerprint, nonce)."""


def chain_of(prev: str | None, body: bytes) -> str:
    """The plaintext chain hash of a message body after ``prev`` (``chain_hash`` on bytes)."""
    h = hashlib.sha256((prev or "").encode())
    h.update(body)
    return h.hexdigest()


def mark_encrypted(store: Store, fingerprint: str, aead: str = AEAD_NAME) -> None:
    store.create(Conversation(id=MARKER_ID, title=MARKER_TITLE, metadata={
        "encryption": {"aead": aead, "format": 1, "key": fingerprint}}))


def algorithm_of(mark: dict[str, Any] | None) -> str:
    """What a store's records are sealed with: its mark says (a new store: ``AEAD_NAME``;
    a mark without the field is older than the field, and so GCM-SIV)."""
    return AEAD_NAME if mark is None else str(mark.get("aead", AEAD_GCM_SIV))


def _with_hash(body: bytes, digest: str) -> bytes:
    """A message's stored JSON: its canonical body with ``"hash"`` spliced in."""
    return body[:-1] + b',"hash":' + orjson.dumps(digest) + b"}"


_FIELDS = Message(seq=0, role="event", content="", created_at="", turn_id="sealed",
                  hash="").__dict__
"""Every field of a stored sealed message, at its default (``_seal`` fills in the rest)."""


class _Record(Message):
    """A sealed message as ``_seal`` hands it to the inner store, which calls ``body()``
    (to check its hash) and ``stored()`` (to write it) once more: both answer from what
    ``_seal`` made already. A copy (``model_copy``) has no slot set, so it computes them
    again."""

    __slots__ = ("_binary", "_canonical")  # beside the fields' __dict__: not fields,
    # never copied

    def _made(self) -> str | None:
        return getattr(self, "_canonical", None)

    def binary(self) -> bytes | None:
        """The binary row standing for this record's canonical body (``codec.binary_row``),
        for a store that keeps rows as bytes (sqlite); None for a copy."""
        return getattr(self, "_binary", None) if self._made() is not None else None

    def body(self) -> str:
        made = self._made()
        return made if made is not None else super().body()

    def stored(self) -> dict[str, Any]:
        part = self.content[0] if isinstance(self.content, list) and \
            len(self.content) == 1 else None
        if self._made() is None or not isinstance(part, dict) or \
                part.get("type") != SEALED_PART or part.get("v") != CHAINED:
            return super().stored()
        # in the canonical body's order, "hash" last: a json document line is then the
        # body and its hash, and a load cuts it rather than parsing it (``_doc.stored_rows``)
        return {"content": [{"data": part["data"], "type": SEALED_PART, "v": CHAINED}],
                "created_at": self.created_at, "model": None, "params": None,
                "role": "event", "seq": self.seq, "status": self.status,
                "turn_id": "sealed", "usage": None, "hash": self.hash}


class SealedStore(ForwardingStore):
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
    def _at(self, cid: str, seq: int | None = None, what: str = "") -> str:
        where = f"{self.inner.url}: conversation {cid!r}"
        return where + (f" seq {seq}" if seq is not None else "") + (f" {what}" if what else "")

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
        data = binascii.b2a_base64(raw, newline=False).decode("ascii")
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

    def _open_parts(self, cid: str, seq: int, content: object, prev: str | None
                    ) -> tuple[bytes, str]:
        """The plaintext body of a stored record's content (its tag checked) and its
        plaintext chain hash: carried in the sealed plaintext (format 2), or made from
        ``prev`` and the body (format 1)."""
        part = content[0] if isinstance(content, list) and content else None
        if not isinstance(part, dict) or part.get("type") != SEALED_PART:
            where = self._at(cid, seq)
            raise CorruptTranscriptError(f"{where} is not sealed, but this store is encrypted "
                                         "(a plain record was put in it); nothing was changed",
                                         where=where, position=seq)
        version = part.get("v", 1)
        if type(version) is not int or version not in (1, CHAINED):
            where = self._at(cid, seq)
            raise CorruptTranscriptError(f"{where}: sealed in format {version!r}, which this "
                                         "version does not know (upgrade chatstate); nothing "
                                         "was changed", where=where, position=seq)
        try:
            raw = binascii.a2b_base64(str(part.get("data")))
        except (binascii.Error, ValueError) as exc:
            where = self._at(cid, seq)
            raise CorruptTranscriptError(f"{where}: the sealed record is not base64; nothing "
                                         "was changed", where=where, position=seq) from exc
        plain = self.codec.open("message", cid, seq, raw, lambda: self._at(cid, seq), prev,
                                version)
        if version == 1:
            return plain, chain_of(prev, plain)
        try:
            return plain[64:], plain[:64].decode("ascii")
        except UnicodeDecodeError:
            where = self._at(cid, seq)
            raise CorruptTranscriptError(f"{where}: the sealed record holds no chain hash; "
                                         "nothing was changed", where=where,
                                         position=seq) from None

    def _open_chain(self, cid: str, stored: Sequence[Message]) -> list[Message]:
        bodies: list[bytes] = []
        hashes: list[str] = []
        prev: str | None = None
        for record in stored:
            body, prev = self._open_parts(cid, record.seq, record.content, prev)
            bodies.append(body)
            hashes.append(prev)
        return self._validate(cid, bodies, hashes)

    def _open_partial(self, cid: str, stored: Message, prev: str | None) -> Message:
        return self._partial_from(cid, stored.seq,
                                  *self._open_parts(cid, stored.seq, stored.content, prev))

    def _partial_from(self, cid: str, seq: int, body: bytes, digest: str) -> Message:
        msg = Message.model_validate_json(_with_hash(body, digest))
        if msg.seq != seq:
            where = self._at(cid, seq)
            raise CorruptTranscriptError(f"{where}: the sealed partial reply holds another "
                                         "position; nothing was changed", where=where,
                                         position=seq)
        return msg

    # -- header ------------------------------------------------------------------------
    def _seal_title(self, cid: str, title: str) -> str:
        return self.codec.seal_text("title", cid, None, title)

    def _seal_metadata(self, cid: str, metadata: dict[str, Any]) -> dict[str, Any]:
        return {SEALED_META: self.codec.seal_text("metadata", cid, None,
                                                  canonical_json(metadata))}

    def _open_title(self, cid: str, title: str) -> str:
        return self.codec.open_text("title", cid, None, title, self._at(cid, what="title"))

    def _open_metadata(self, cid: str, metadata: dict[str, Any]) -> dict[str, Any]:
        where = self._at(cid, what="metadata")
        if set(metadata) != {SEALED_META}:
            raise CorruptTranscriptError(f"{where} is not sealed, but this store is "
                                         "encrypted; nothing was changed", where=where)
        opened = json.loads(self.codec.open_text("metadata", cid, None,
                                                 metadata[SEALED_META], where))
        if not isinstance(opened, dict):
            raise CorruptTranscriptError(f"{where} is not an object", where=where)
        return opened

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

    def _fast_load(self, cid: str) -> Conversation | None:
        """The rows of a store that hands them over as stored (``stored_rows``: sqlite,
        postgresql, json), their stored chain verified and opened here without building
        the sealed messages first; None for other stores (and rows it cannot give).
        A store that checks the stored chain of some rows as it reads them (the json
        store, ``checked_rows``) says how many, and those are not hashed again."""
        checked_of = getattr(self.inner, "checked_rows", None)
        rows_of = getattr(self.inner, "stored_rows", None)
        sizes_of = getattr(self.inner, "blob_sizes", None)
        if rows_of is None or sizes_of is None:
            return None
        checked = 0
        if checked_of is not None:
            found = checked_of(cid)
            got = None if found is None else found[:3]
            checked = 0 if found is None else found[3]
        else:
            got = rows_of(cid)
        if got is None:  # not laid out as written: the store's own load names it
            return None
        head, rows, partial_row = got
        where = self._at(cid)
        named: dict[str, tuple[int, int]] = {}
        bodies, hashes = self._open_rows(cid, rows, named, checked)
        if len(rows) != head[5] or (rows[-1][2] if rows else None) != head[6]:
            position = min(int(head[5]), len(rows))
            raise CorruptTranscriptError(
                f"{where}: the conversation row records {head[5]} messages but {len(rows)} "
                f"are stored (cut off or added by hand from seq {position}); the database "
                "was left as it is", where=where, position=position)
        messages = self._validate(cid, bodies, hashes)
        return self._finish(cid, head, messages, partial_row, rows[-1][2] if rows else None,
                            named)

    def _finish(self, cid: str, head: tuple[Any, ...], messages: list[Message],
                partial_row: tuple[int, bytes] | None, stored_last: str | None,
                named: dict[str, tuple[int, int]]) -> Conversation:
        """A fast load's conversation from its opened messages: the partial reply opened,
        the blobs named checked, the header opened, the tail noted."""
        where = self._at(cid)
        last = messages[-1].hash if messages else None
        partial = None
        if partial_row is not None and partial_row[0] == len(messages):
            seq = partial_row[0]
            partial = self._partial_from(cid, seq, *self._open_parts(
                cid, seq, self._parts(cid, seq, partial_row[1], named), last))
        if named:
            held = self.inner.blob_sizes(list(named))  # type: ignore[attr-defined]
            for sha, (size, seq) in named.items():
                if held.get(sha) != size:
                    what = "is missing" if sha not in held else \
                        f"has {held[sha]} bytes, not {size}"
                    raise CorruptTranscriptError(
                        f"blob {sha}: the blob named by message seq {seq} of {where} {what}; "
                        "nothing was changed. Restore the blob from a backup.",
                        where=f"blob {sha}", position=seq)
        with self._lock:
            self._tails[cid] = (len(messages), stored_last, last)
        return Conversation.model_construct(
            id=head[0], title=self._open_title(cid, head[1]), created_at=head[2],
            updated_at=head[3], metadata=self._open_metadata(cid, orjson.loads(head[4])),
            messages=messages, partial=partial)

    def _keyed_load(self, cid: str) -> Conversation | None:
        """The load with the key of a store that keeps sealed records as binary rows
        (``sealed_rows``: sqlite), when every row is one that opens: each record's tag
        checked (bound to its conversation, its position and the plaintext chain hash
        before it, so the tags alone fix content and order), the plaintext chain hash it
        carries taken as the message's, and its fields in the clear (time, status) checked
        against its plaintext (``_check_clear``). The chain over the stored bytes, which
        covers the same sealed bytes and clear fields, is not hashed again (the costliest
        part of a load, base64 included): ``verified_load`` does, as ``replay --verify``
        and ``doctor`` do with the key, and every keyless check. None (the verified path
        then decides, and names any damage) for anything else: a text row (written
        before schema 10, or a record naming blobs), a record that does not open."""
        rows_of = getattr(self.inner, "sealed_rows", None)
        got = rows_of(cid) if rows_of is not None else None
        if got is None:
            return None
        head, raws, partial_row = got
        opened = self._open_binary(cid, raws)
        if opened is None:
            return None
        bodies, hashes, clears = opened
        messages = self._validate(cid, bodies, hashes)
        self._check_clear(cid, clears, messages)
        return self._finish(cid, head, messages, partial_row, head[6], {})

    def _open_binary(self, cid: str, raws: list[bytes]
                     ) -> tuple[list[bytes], list[bytes], list[bytes]] | None:
        """Every binary row opened inline (the hot loop of a load): the plaintext bodies,
        their chain hashes (ASCII) and each row's clear fields; None if a row is not a
        binary row of a record that opens here."""
        ciphers = self.codec.ciphers()
        prefix = b"chatstate/v%d\0message\0%s\0" % (CHAINED, cid.encode())
        bodies: list[bytes] = []
        hashes: list[bytes] = []
        clears: list[bytes] = []
        add_body, add_hash, add_clear = bodies.append, hashes.append, clears.append
        last = b""
        try:
            for position, raw in enumerate(raws):
                at = raw[1] + 2
                if raw[0] != BINARY_ROW:
                    return None
                plain = ciphers[raw[at:at + FP_BYTES]].decrypt(
                    raw[at + FP_BYTES:at + _HEAD], raw[at + _HEAD:],
                    prefix + b"%d\0%s" % (position, last))
                if len(plain) <= 64:
                    return None
                last = plain[:64]
                add_body(plain[64:])
                add_hash(last)
                add_clear(raw[2:at])
        except Exception:  # a short row, another key or algorithm, InvalidTag: the
            return None    # verified path opens it or names it
        return bodies, hashes, clears

    def _check_clear(self, cid: str, clears: list[bytes], messages: list[Message]) -> None:
        """Each binary row's clear fields (``codec.clear_fields``: its time and status as
        JSON strings) are those of its authenticated plaintext: what the stored chain covers
        in the row besides the sealed bytes (whose tag was checked) and the seq (checked by
        ``sealed_rows``). Compared all at once (orjson's spelling); a row that differs is
        compared again as ``canonical_json`` spells a string, and refused if still not."""
        dumps = orjson.dumps
        expected = list(map(b"\n".join, zip(
            map(dumps, map(attrgetter("created_at"), messages)),
            map(dumps, map(attrgetter("status"), messages)), strict=True)))
        if expected == clears:
            return
        for position, (clear, want, msg) in enumerate(zip(clears, expected, messages,
                                                          strict=True)):
            if clear == want or clear == clear_fields(
                    _json_str(msg.created_at).encode("utf-8", "surrogatepass"),
                    _json_str(msg.status).encode("utf-8", "surrogatepass")):
                continue
            where = self._at(cid, position)
            raise CorruptTranscriptError(
                f"{where}: the record's fields in the clear (its time or status) are not "
                "those it was sealed with (the stored record was edited); nothing was "
                "changed", where=where, position=position)

    def _open_rows(self, cid: str, rows: Sequence[tuple[int, bytes, str]],
                   named: dict[str, tuple[int, int]], checked: int = 0
                   ) -> tuple[list[bytes], list[bytes]]:
        """Each stored row (seq, canonical body, stored hash) verified against the stored
        chain (but the first ``checked``, which the store verified as it read them) and
        opened: the plaintext bodies and their plaintext chain hashes (ASCII), in one
        pass. A format 2 record carries its hash in its authenticated plaintext, so only
        a format 1 record's body is hashed. The blobs rows name are noted in ``named``."""
        open1 = self.codec.opener("message", cid)
        open2 = self.codec.opener("message", cid, CHAINED)
        sha256, a2b, start = hashlib.sha256, binascii.a2b_base64, len(ROW_HEAD)
        bodies: list[bytes] = []
        hashes: list[bytes] = []
        add_body, add_hash = bodies.append, hashes.append
        prev = rows[checked - 1][2].encode() if 0 < checked <= len(rows) else b""
        last = b""  # the stored and the plaintext chain hash before, as ASCII
        for position, (seq, raw, digest) in enumerate(rows):
            if is_binary_row(raw):  # hashed and opened as the canonical body it stands for
                with contextlib.suppress(ValueError):  # (not one: _parts names it)
                    raw = expand_row(seq, raw)
            if position >= checked:
                h = sha256(prev)
                h.update(raw)
                if seq != position or h.hexdigest() != digest:
                    where = self._at(cid)
                    raise CorruptTranscriptError(
                        f"{where}: hash chain broken at seq {position} (a record was edited, "
                        "removed or reordered); the store was left as it is", where=where,
                        position=position)
                prev = digest.encode()
            end = raw.find(b'"', start)
            body = None
            if raw.startswith(ROW_TAIL, end) and raw.startswith(ROW_HEAD):
                try:  # one sealed part, no blob: the data is cut out, not parsed
                    plain = open2(seq, a2b(raw[start:end]), last)
                except (binascii.Error, ValueError):
                    plain = None
                if plain is not None and len(plain) > 64:
                    body, last = plain[64:], plain[:64]
            elif raw.startswith(ROW_TAIL_V1, end) and raw.startswith(ROW_HEAD):
                try:  # format 1: the body is hashed here
                    body = open1(seq, a2b(raw[start:end]), last)
                except (binascii.Error, ValueError):
                    body = None
                if body is not None:
                    h = sha256(last)
                    h.update(body)
                    last = h.hexdigest().encode()
            if body is None:  # blob parts, a record that does not open, anything unusual
                body, text = self._open_parts(cid, seq, self._parts(cid, seq, raw, named),
                                              last.decode() or None)
                last = text.encode()
            add_body(body)
            add_hash(last)
        return bodies, hashes

    def _validate(self, cid: str, bodies: list[bytes], hashes: Sequence[bytes | str],
                  chunk: int = 512) -> list[Message]:
        """The plaintext messages from their bodies and chain hashes (``_open_rows``),
        through the plain stores' fast path (orjson and the records' structural check),
        and what that path refuses validated in chunks by one pydantic-core call each."""
        try:
            texts = [h if isinstance(h, str) else h.decode("ascii") for h in hashes]
        except UnicodeDecodeError:
            where = self._at(cid)
            raise CorruptTranscriptError(f"{where}: a sealed message holds no chain hash; "
                                         "nothing was changed", where=where) from None
        messages: list[Message] = []
        for start in range(0, len(bodies), chunk):
            some, their = bodies[start:start + chunk], texts[start:start + chunk]
            try:
                part = stored_messages(zip(some, their, strict=True))
            except (ValueError, TypeError):  # the exact path decides, and names the damage
                part = None
            try:
                if part is None:
                    part = validate_json_array(
                        b"[" + b",".join(map(_with_hash, some, their)) + b"]")
            except ValueError as exc:
                where = self._at(cid)
                raise CorruptTranscriptError(f"{where}: a sealed message does not hold a valid "
                                             "message; nothing was changed",
                                             where=where) from exc
            for offset, msg in enumerate(part):
                if msg.seq != start + offset:
                    where = self._at(cid, start + offset)
                    raise CorruptTranscriptError(f"{where}: the sealed message holds another "
                                                 "position; nothing was changed", where=where,
                                                 position=start + offset)
            messages.extend(part)
        return messages

    def _parts(self, cid: str, seq: int, raw: bytes,
               named: dict[str, tuple[int, int]]) -> object:
        """A stored row's content parts; the blobs it names noted in ``named``."""
        try:
            content = orjson.loads(raw)["content"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            where = self._at(cid, seq)
            raise CorruptTranscriptError(f"{where} is unreadable; the database was left as "
                                         "it is", where=where, position=seq) from exc
        if isinstance(content, list):
            for part in content[1:]:
                ref = part.get("blob") if isinstance(part, dict) else None
                if isinstance(ref, dict) and isinstance(ref.get("sha256"), str):
                    size = ref.get("size")
                    named.setdefault(ref["sha256"], (size if isinstance(size, int) else -1, seq))
        return content

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


def verified_load(store: Store, conversation_id: str) -> Conversation:
    """``store.load``, and where an encrypted store opened with its key is found under the
    wrappers, its ``verified_load``: both chains and every tag checked."""
    inner: object = store
    while not isinstance(inner, SealedStore) and isinstance(inner, ForwardingStore):
        inner = inner.inner
    if isinstance(inner, SealedStore):
        return inner.verified_load(conversation_id)
    return store.load(conversation_id)


def is_sealed(conversation: Conversation) -> bool:
    """Does this conversation, loaded without the key, hold sealed records?"""
    first = conversation.messages[0] if conversation.messages else conversation.partial
    content = first.content if first is not None else None
    return bool(isinstance(content, list) and content and
                content[0].get("type") == SEALED_PART) or \
        SEALED_META in conversation.metadata


def describe_sealed(conversation: Conversation) -> str:
    """What ``replay --verify`` proved of an encrypted conversation without the key."""
    tip = conversation.last.hash[:16] if conversation.last else "-"
    fps = ", ".join(sorted({binascii.a2b_base64(str(m.content[0].get("data", ""))[:12])
                            [:FP_BYTES].hex() for m in conversation.messages
                            if isinstance(m.content, list) and m.content})) or "-"
    return (f"verified without the key: {len(conversation.messages)} sealed messages of "
            f"{conversation.id!r}, the hash chain over the stored ciphertext intact (head "
            f"{tip}…), sealed by key {fps}; the authentication tags need the key to check")


def encryption_note(store: Store) -> str | None:
    """For ``doctor``: how the store is encrypted and what a load checks (None: plain)."""
    rot = (marker(store.inner if isinstance(store, SealedStore) else store) or {}).get("rekey")
    running = (f"; a rekey from key {rot.get('from')} is under way (both keys read): run "
               "`chatstate rekey` again to finish it") if isinstance(rot, dict) else ""
    if isinstance(store, SealedStore):
        return (f"{store.codec.aead}, key {store.codec.fingerprint} configured: every record "
                "loaded has its authentication tag checked" + running)
    mark = marker(store)
    if mark is None:
        return None
    return (f"{algorithm_of(mark)}, sealed by key {mark.get('key')}; no key "
            "configured: the hash chains over the stored ciphertext are verified, the "
            "authentication tags are not (set the key to check them too)" + running)


def seal_opened(store: Store, *, keyless: bool = False,
                key: bytes | Literal["env"] | None = "env",
                old_keys: Sequence[bytes] = ()) -> Store:
    """``store`` (opened) sealed by the configured key; refused when key and store disagree.

    ``keyless``: an encrypted store may be returned as it is stored, without a key
    (sealed records, for checks that need none: ``replay --verify``, ``doctor``).
    """
    from chatstate.stores.keys import load_key

    if key == "env":
        key = load_key()
        old = load_key(old=True)
        old_keys = [*old_keys, old] if old else old_keys
    mark = marker(store)
    if key is None:
        if mark is None or keyless:
            return store
        raise ConfigurationError(
            f"{store.url} is encrypted (key {mark.get('key')}) and no key is configured: set "
            "CHATSTATE_ENCRYPTION_KEY, CHATSTATE_KEY_FILE or CHATSTATE_KEY_COMMAND "
            "(`chatstate replay --verify` and `chatstate doctor` check it without one)")
    from chatstate.stores.rekey import rotation_codec

    codec = (rotation_codec(key, old_keys, mark) if mark is not None else None) or \
        AeadCodec(key, older=list(old_keys), aead=algorithm_of(mark))  # a rekey running:
    # the new key, and either opens
    if mark is None:
        if store.list_conversations(limit=1):
            raise ConfigurationError(
                f"{store.url} holds plain conversations, and an encryption key is configured: "
                "a store created without a key stays plain. Unset the key to use it, or copy "
                "it into a new encrypted store with `chatstate migrate`")
        try:
            mark_encrypted(store, codec.fingerprint)
        except ConflictError:  # another process marked it first
            mark = marker(store)
            if algorithm_of(mark) != codec.aead:
                codec = AeadCodec(key, older=list(old_keys), aead=algorithm_of(mark))
    if mark is not None and not codec.knows(str(mark.get("key"))):
        raise ConfigurationError(
            f"{store.url}: wrong encryption key: the store was encrypted by key "
            f"{mark.get('key')}, the configured key is {codec.fingerprint}; nothing was read "
            "or changed")
    return SealedStore(store, codec)
