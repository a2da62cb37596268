"""The fast loads of an encrypted store: rows handed over as stored (sqlite, postgresql,
json) verified and opened without building the sealed messages first, and binary rows
opened inline with the key (``FastReading``, a part of ``SealedStore``)."""

from __future__ import annotations

import binascii
import contextlib
import hashlib
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import orjson

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    CorruptTranscriptError,
)
from chatstate.stores import _b64 as b64
from chatstate.stores._mark import marker as marker  # the mark's reader, for the drill and tools
from chatstate.stores.codec import (
    CHAINED,
    FP_BYTES,
    ROW_HEAD,
    ROW_TAIL,
    ROW_TAIL_V1,
    clear_fields,
    expand_row,
    is_binary_row,
)
from chatstate.stores.sealed._reading import Reading
from chatstate.stores.sealed._record import _HEAD, _json_str


class FastReading(Reading):
    """``_fast_load`` and ``_keyed_load`` (see ``SealedStore._load``)."""

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
        (``sealed_rows``: sqlite, json), when every row is one that opens: each record's
        tag checked (bound to its conversation, its position and the plaintext chain hash
        before it, so the tags alone fix content and order), the plaintext chain hash it
        carries taken as the message's, and its fields in the clear (time, status) checked
        against its plaintext (``_check_clear``). The chain over the stored bytes, which
        covers the same sealed bytes and clear fields, is not hashed again (the costliest
        part of a load, base64 included): ``verified_load`` does, as ``replay --verify``
        and ``doctor`` do with the key, and every keyless check. None (the verified path
        then decides, and names any damage) for anything else: a text row (written
        before schema 10, or a record naming blobs), a record that does not open.
        The store hands the rows over a chunk at a time, each opened and made into
        messages before the next is read."""
        rows_of = getattr(self.inner, "sealed_rows", None)
        if rows_of is None:
            return None
        messages: list[Message] = []
        last = b""  # the plaintext chain hash so far

        def take(sealed: list[bytes], clears: list[bytes]) -> bool:
            nonlocal last
            first = len(messages)
            opened = self._open_sealed(cid, sealed, first, last)
            if opened is None or len(clears) != len(sealed):
                return False
            bodies, hashes = opened
            part = self._validate(cid, bodies, hashes, first)
            self._check_clear(cid, clears, part, first)
            messages.extend(part)
            if hashes:
                last = hashes[-1]
            return True

        got = rows_of(cid, take)
        if got is None:
            return None
        head, partial_row = got
        return self._finish(cid, head, messages, partial_row, head[6], {})

    def _open_sealed(self, cid: str, sealed: list[bytes], first: int, last: bytes
                     ) -> tuple[list[bytes], list[bytes]] | None:
        """Sealed records from seq ``first`` on (after the plaintext chain hash ``last``)
        opened inline (the hot loop of a load): the plaintext bodies and their chain
        hashes (ASCII); None if one is not a record that opens here."""
        ciphers = self.codec.ciphers()
        prefix = b"chatstate/v%d\0message\0%s\0" % (CHAINED, cid.encode())
        bodies: list[bytes] = []
        hashes: list[bytes] = []
        add_body, add_hash = bodies.append, hashes.append
        try:
            for position, record in enumerate(sealed, first):
                plain = ciphers[record[:FP_BYTES]].decrypt(
                    record[FP_BYTES:_HEAD], record[_HEAD:],
                    prefix + b"%d\0%s" % (position, last))
                if len(plain) <= 64:
                    return None
                last = plain[:64]
                add_body(plain[64:])
                add_hash(last)
        except Exception:  # a short record, another key or algorithm, InvalidTag: the
            return None    # verified path opens it or names it
        return bodies, hashes

    def _check_clear(self, cid: str, clears: list[bytes], messages: list[Message],
                     first: int = 0) -> None:
        """Each binary row's clear fields (``codec.clear_fields``: its time and status as
        JSON strings) are those of its authenticated plaintext: what the stored chain covers
        in the row besides the sealed bytes (whose tag was checked) and the seq (checked by
        ``sealed_rows``). Compared all at once (orjson's spelling); a row that differs is
        compared again as ``canonical_json`` spells a string, and refused if still not.
        The rows and messages are those from seq ``first`` on."""
        dumps = orjson.dumps
        expected = list(map(clear_fields, map(dumps, map(attrgetter("created_at"), messages)),
                            map(dumps, map(attrgetter("status"), messages))))
        if expected == clears:
            return
        for position, (clear, want, msg) in enumerate(zip(clears, expected, messages,
                                                          strict=True), first):
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
        sha256, a2b, start = hashlib.sha256, b64.decode, len(ROW_HEAD)
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

