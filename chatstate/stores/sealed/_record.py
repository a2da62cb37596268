"""A sealed message as the encrypted store writes it: the canonical body of its stored
record, made as text, and ``_Record``, which answers ``body()`` and ``stored()`` from
it (``SealedStore._seal``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

from chatstate.core.transcript import Message
from chatstate.stores._mark import marker as marker  # the mark's reader, for the drill and tools
from chatstate.stores.codec import (
    CHAINED,
    FP_BYTES,
    NONCE_BYTES,
    ROW_END,
    ROW_HEAD,
    ROW_MID,
    ROW_SEQ,
    SEALED_PART,
)

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

    __slots__ = ("_after", "_binary", "_canonical")  # beside the fields' __dict__: not
    # fields, never copied

    def _made(self) -> str | None:
        return getattr(self, "_canonical", None)

    def _chained(self, prev_hash: str | None) -> bool:
        """Whether ``_seal`` made this record's hash as the chain hash of its canonical
        body after ``prev_hash`` (the stored hash before it): then a store's check of
        that link need not hash the body again."""
        return self._made() is not None and getattr(self, "_after", False) == prev_hash

    def expected_hash(self, prev_hash: str | None) -> str:
        return self.hash if self._chained(prev_hash) else super().expected_hash(prev_hash)

    def hash_after(self, prev_hash: str | None, body: str) -> str:
        if body is self._made() and self._chained(prev_hash):
            return self.hash
        return super().hash_after(prev_hash, body)

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


