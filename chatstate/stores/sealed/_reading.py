"""Opening what an encrypted store holds: a record's sealed parts, the chain of a
conversation, its partial reply, title and metadata, and the opened bodies
validated as messages (``Reading``, a part of ``SealedStore``)."""

from __future__ import annotations

import binascii
import json
import threading
from collections.abc import Sequence
from typing import Any

import orjson

from chatstate.core.transcript import Message
from chatstate.errors import (
    CorruptTranscriptError,
)
from chatstate.stores._fastload import stored_messages, validate_json_array
from chatstate.stores._mark import marker as marker  # the mark's reader, for the drill and tools
from chatstate.stores.base import (
    Store,
)
from chatstate.stores.codec import (
    CHAINED,
    SEALED_META,
    SEALED_PART,
    AeadCodec,
)
from chatstate.stores.sealed._record import _with_hash, chain_of

_Tail = tuple[int, str | None, str | None]
"""(message count, stored hash of the last message, its plaintext chain hash)"""


class Reading:
    """The opening side of ``SealedStore`` (its ``codec``, ``inner`` store and tails)."""

    codec: AeadCodec
    inner: Store
    _tails: dict[str, _Tail]
    _lock: threading.Lock

    def _at(self, cid: str, seq: int | None = None, what: str = "") -> str:
        where = f"{self.inner.url}: conversation {cid!r}"
        return where + (f" seq {seq}" if seq is not None else "") + (f" {what}" if what else "")


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


    def _validate(self, cid: str, bodies: list[bytes], hashes: Sequence[bytes | str],
                  first: int = 0, chunk: int = 512) -> list[Message]:
        """The plaintext messages from their bodies and chain hashes (``_open_rows``),
        the first at seq ``first``, through the plain stores' fast path (orjson and the
        records' structural check), and what that path refuses validated in chunks by
        one pydantic-core call each."""
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
            for seq, msg in enumerate(part, first + start):
                if msg.seq != seq:
                    where = self._at(cid, seq)
                    raise CorruptTranscriptError(f"{where}: the sealed message holds another "
                                                 "position; nothing was changed", where=where,
                                                 position=seq)
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

