"""The store layer's one codec seam: how a record's bytes are sealed on the way to a store.

Two codecs. ``PLAIN`` is the identity: a record is stored as it is today, so a
plain store keeps exactly its bytes and hashes. ``AeadCodec`` seals a record
with AES-256-GCM (``cryptography``, the ``chatstate[crypto]`` extra, imported
only when a key is configured); a store sealed with AES-256-GCM-SIV by an earlier
build keeps sealing with it (its mark names the algorithm), and a record of either
opens anywhere. Every sealed record carries the keyed
fingerprint of the key that sealed it, and its associated data binds it to
what it is: (kind, conversation id, seq, the plaintext chain hash before it) for
messages and partial replies (so the tags fix the order too),
(kind, conversation id) for a title or metadata, the kind alone for a blob
(blobs are shared between conversations). A record moved to another
conversation, seq or kind fails its tag.

The nonce is synthetic: HMAC-SHA256 under a nonce key of (associated data,
plaintext), cut to 96 bits. The same record at the same place therefore seals
to the same bytes, so a retried append is still a no-op, the partial reply a
writer commits seals exactly as the stored partial, and a blob is stored once
per key; distinct records get distinct nonces with the odds of random ones
(two share one only when they are the same record at the same place, so GCM's
one weakness, a nonce repeated for different plaintexts, does not arise). What that
reveals: that two sealed records at the same place are equal, which the hash chain
shows anyway.

Messages and partial replies are sealed in format 2 (``CHAINED``, ``seal_chained``): the
plaintext is the record's plaintext chain hash followed by its body, the associated data
says ``v2``, and the nonce is the HMAC of (associated data, that hash), which stands for
the body. Format 1 records (the body alone, ``v1`` associated data) still open.

Subkeys (encryption, one per algorithm; nonce; fingerprint) are derived from the 32-byte master
key with HMAC-SHA256 under distinct labels; the master key never leaves this module.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from chatstate.errors import (
    ChatstateError,
    ConfigurationError,
    CorruptTranscriptError,
    MissingExtra,
)
from chatstate.stores import _b64 as b64

Where = str | Callable[[], str]
"""How an error names the record: the text, or a function making it (only on failure)."""

KEY_PREFIX = "csk1-"
"""What a chatstate key looks like: ``csk1-`` and 43 base64url characters (32 bytes)."""
AEAD_NAME = "AES-256-GCM"
"""What new stores are sealed with (their mark says so: ``aead``)."""
AEAD_GCM_SIV = "AES-256-GCM-SIV"
"""What stores were sealed with before 0.4 (their mark says so); still opened, and still
used to seal new records in a store whose mark names it."""
ALGORITHMS = (AEAD_NAME, AEAD_GCM_SIV)
SEALED_PART = "chatstate.sealed"
"""The content part type of a sealed message as a store holds it."""
SEALED_BLOB_PART = "chatstate.blob"
"""A stored message's part naming a sealed blob (so the store's blob checks and gc see it)."""
SEALED_META = "chatstate.sealed"
"""The one metadata key of a sealed header."""
BLOB_MAGIC = b"CSB1"
FP_BYTES = 8
NONCE_BYTES = 12
TAG_BYTES = 16
BLOB_OVERHEAD = len(BLOB_MAGIC) + FP_BYTES + NONCE_BYTES + TAG_BYTES
"""A sealed blob is this many bytes longer than its plaintext."""


def new_key() -> str:
    """A fresh random key, as ``chatstate keygen`` prints it."""
    return KEY_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def parse_key(text: str, source: str) -> bytes:
    """The 32 key bytes of ``text``; a clear error naming ``source`` (never the key)."""
    value = text.strip()
    if value.startswith(KEY_PREFIX):
        value = value[len(KEY_PREFIX):]
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ConfigurationError(f"the encryption key from {source} is not a chatstate key "
                                 f"(expected {KEY_PREFIX} and 43 base64url characters, 32 "
                                 "bytes); make one with `chatstate keygen`")
    return raw


def _derive(master: bytes, label: str) -> bytes:
    return hmac.new(master, b"chatstate/v1/" + label.encode(), hashlib.sha256).digest()


def fingerprint_of(master: bytes) -> str:
    """The keyed fingerprint of a key: names it in records and messages, reveals nothing."""
    return _derive(master, "fingerprint")[:FP_BYTES].hex()


CHAINED = 2
"""The sealed-record format that carries its own plaintext chain hash (``seal_chained``);
1 is the format before it (the body alone), still opened."""


def _ad(kind: str, cid: str, seq: int | None, prev: str | None, version: int = 1) -> bytes:
    return (f"chatstate/v{version}\0{kind}\0{cid}\0{'' if seq is None else seq}\0"
            f"{prev or ''}").encode()


class PlainCodec:
    """The identity codec: records are stored exactly as they are (every plain store)."""

    encrypted = False

    def seal(self, kind: str, cid: str, seq: int | None, plaintext: bytes,
             prev: str | None = None) -> bytes:
        return plaintext

    def open(self, kind: str, cid: str, seq: int | None, stored: bytes, where: Where,
             prev: str | None = None) -> bytes:
        return stored


PLAIN = PlainCodec()


@dataclass
class _Key:
    fingerprint: str
    fp: bytes
    aead: Any
    """What this codec seals with (its algorithm: ``AeadCodec.aead``)."""
    nonce_key: bytes
    other_key: bytes = field(repr=False)
    """The other algorithm's subkey, its cipher made on first use (``other``)."""
    algorithm: str = AEAD_NAME
    openers: list[Any] = field(default_factory=list)
    """The ciphers a record is opened with, the sealing one first: a store sealed by the
    other algorithm (one written before the switch) still opens (``other``)."""
    pads: tuple[Any, Any] | None = field(default=None, repr=False)
    """HMAC-SHA256 under ``nonce_key`` with its two padded-key blocks hashed once
    (``nonce``)."""

    def nonce(self, data: bytes) -> bytes:
        """The synthetic nonce of ``data``: HMAC-SHA256 under the nonce key, cut to 96
        bits. The same value as ``hmac.digest``, from sha256 states made once: the
        one-shot HMAC looks its digest up, and lets the GIL go, on every call (~20 µs
        of an append on a busy machine, against ~1 µs)."""
        if self.pads is None:
            key = self.nonce_key.ljust(64, b"\0")  # 32 bytes: shorter than a block
            self.pads = (hashlib.sha256(bytes(b ^ 0x36 for b in key)),
                         hashlib.sha256(bytes(b ^ 0x5C for b in key)))
        inner, outer = self.pads[0].copy(), self.pads[1].copy()
        inner.update(data)
        outer.update(inner.digest())
        return outer.digest()[:NONCE_BYTES]

    def other(self) -> Any:
        """The cipher of the other algorithm, made on first use (only a record sealed by it
        ever gets there)."""
        if len(self.openers) == 1:
            name = AEAD_GCM_SIV if self.algorithm == AEAD_NAME else AEAD_NAME
            self.openers.append(_cipher(name, self.other_key))
        return self.openers[1]


def _aead_class(name: str) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESGCMSIV
    except ModuleNotFoundError as exc:
        raise MissingExtra("an encryption key is configured, but the 'cryptography' package "
                           "is missing: pip install 'chatstate[crypto]'",
                           extra="crypto") from exc
    return AESGCMSIV if name == AEAD_GCM_SIV else AESGCM


def _cipher(name: str, subkey: bytes) -> Any:
    if name not in ALGORITHMS:
        raise ConfigurationError(f"unknown encryption algorithm {name!r} (this version knows "
                                 f"{', '.join(ALGORITHMS)}); upgrade chatstate")
    try:
        return _aead_class(name)(subkey)
    except MissingExtra:
        raise
    except Exception as exc:  # cryptography built on an OpenSSL without GCM-SIV (< 3.2)
        raise ConfigurationError(f"this cryptography build cannot do {name} ({exc}); "
                                 "install the cryptography wheel from PyPI") from exc


def _subkey(master: bytes, algorithm: str) -> bytes:
    """One encryption subkey per algorithm (GCM-SIV's label is the one it always had), so
    no AES key ever serves two modes."""
    return _derive(master, "encrypt" if algorithm == AEAD_GCM_SIV else "encrypt/aes-256-gcm")


def _load(master: bytes, algorithm: str) -> _Key:
    cipher = _cipher(algorithm, _subkey(master, algorithm))
    fingerprint = fingerprint_of(master)
    return _Key(fingerprint, bytes.fromhex(fingerprint), cipher, _derive(master, "nonce"),
                _subkey(master, AEAD_GCM_SIV if algorithm == AEAD_NAME else AEAD_NAME),
                algorithm, [cipher])


@dataclass
class AeadCodec:
    """Seals records under the primary key; opens records sealed by any key it holds.

    ``older`` keys are accepted for reading only (a ``rekey`` that has not finished).
    ``aead``: the algorithm records are sealed with (the store's mark names it); a
    record sealed by the other one still opens.
    """

    primary: bytes = field(repr=False)
    older: Iterable[bytes] = field(default=(), repr=False)
    aead: str = AEAD_NAME
    encrypted = True

    def __post_init__(self) -> None:
        self._primary = _load(self.primary, self.aead)
        self._keys = {self._primary.fingerprint: self._primary}
        for key in self.older:
            loaded = _load(key, self.aead)
            self._keys.setdefault(loaded.fingerprint, loaded)
        self._by_fp = {k.fp: k for k in self._keys.values()}
        self.primary = b""  # the master key is not kept: only its subkeys
        self.older = ()

    @property
    def fingerprint(self) -> str:
        return self._primary.fingerprint

    def subkey(self, label: str) -> bytes:
        """A key derived from the primary key for another use (the keyed search index):
        HMAC-SHA256 of a distinct label under the secret nonce key."""
        return hmac.new(self._primary.nonce_key, b"chatstate/v1/sub/" + label.encode(),
                        hashlib.sha256).digest()

    def knows(self, fingerprint: str) -> bool:
        return fingerprint in self._keys

    def seal(self, kind: str, cid: str, seq: int | None, plaintext: bytes,
             prev: str | None = None) -> bytes:
        """fingerprint (8) | nonce (12) | ciphertext and tag. ``prev``: the plaintext chain
        hash before a message, bound too, so the tags alone also fix the order."""
        key, ad = self._primary, _ad(kind, cid, seq, prev)
        nonce = key.nonce(ad + b"\0" + plaintext)
        sealed: bytes = key.aead.encrypt(nonce, plaintext, ad)
        return key.fp + nonce + sealed

    def seal_chained(self, kind: str, cid: str, seq: int, body: bytes, prev: str | None,
                     digest: str) -> bytes:
        """A message or partial reply in format 2 (``CHAINED``): the plaintext is its
        plaintext chain hash ``digest`` (64 hex characters: sha256 of ``prev`` and
        ``body``, which the caller computed or checked) followed by ``body``, under
        associated data of version 2, so a load takes the hash from the authenticated
        plaintext instead of hashing the body again. The nonce is the HMAC of the
        associated data and ``digest``, which stands for the body (SHA-256), so two
        distinct records at one place still never share one."""
        key, ad, mark = self._primary, _ad(kind, cid, seq, prev, CHAINED), digest.encode()
        nonce = key.nonce(ad + b"\0" + mark)
        sealed: bytes = key.aead.encrypt(nonce, mark + body, ad)
        return key.fp + nonce + sealed

    def ciphers(self) -> dict[bytes, Any]:
        """For a load's inline open: each key's fingerprint (8 bytes) -> the cipher that
        seals with this codec's algorithm (a record of the other one fails there, and
        ``open`` then tries it)."""
        return {fp: key.aead for fp, key in self._by_fp.items()}

    def opener(self, kind: str, cid: str, version: int = 1
               ) -> Callable[[int, bytes, bytes], bytes | None]:
        """A load's fast ``open``: ``(seq, stored, prev as ASCII bytes)`` -> the plaintext,
        or None when the record does not open (``open`` then names what is wrong).
        ``version``: the records' format (``CHAINED``: the plaintext starts with the
        record's chain hash)."""
        by_fp = self._by_fp
        prefix = f"chatstate/v{version}\0{kind}\0{cid}\0".encode()
        head = FP_BYTES + NONCE_BYTES

        def open_(seq: int, stored: bytes, prev: bytes) -> bytes | None:
            key = by_fp.get(stored[:FP_BYTES])
            if key is None or len(stored) < head + TAG_BYTES:
                return None
            try:
                opened: bytes = key.aead.decrypt(stored[FP_BYTES:head], stored[head:],
                                                 prefix + b"%d\0%s" % (seq, prev))
            except Exception:  # InvalidTag, or sealed by the other algorithm: ``open`` says
                return None
            return opened
        return open_

    def open(self, kind: str, cid: str, seq: int | None, stored: bytes, where: Where,
             prev: str | None = None, version: int = 1) -> bytes:
        """The plaintext; one clear line naming ``where`` (conversation and seq) when not.
        ``version``: the record's format (``CHAINED``: its chain hash, then its body)."""
        if not isinstance(where, str):
            try:
                return self._open(kind, cid, seq, stored, "", prev, version)
            except ChatstateError:
                pass  # again, to name the place (made only on failure: loads are hot)
            where = where()
        return self._open(kind, cid, seq, stored, where, prev, version)

    def _open(self, kind: str, cid: str, seq: int | None, stored: bytes, where: str,
              prev: str | None, version: int = 1) -> bytes:
        if len(stored) < FP_BYTES + NONCE_BYTES + TAG_BYTES:
            raise CorruptTranscriptError(f"{where}: the sealed record is cut short "
                                         f"({len(stored)} bytes); nothing was changed",
                                         where=where, position=seq)
        fp = stored[:FP_BYTES].hex()
        key = self._keys.get(fp)
        if key is None:
            raise ConfigurationError(f"{where}: sealed by key {fp}, but the configured key is "
                           f"{self.fingerprint}: set the key that encrypted this store "
                           "(CHATSTATE_ENCRYPTION_KEY, CHATSTATE_KEY_FILE or "
                           "CHATSTATE_KEY_COMMAND); nothing was changed")
        nonce, body = stored[FP_BYTES:FP_BYTES + NONCE_BYTES], stored[FP_BYTES + NONCE_BYTES:]
        ad = _ad(kind, cid, seq, prev, version)
        try:
            return bytes(key.aead.decrypt(nonce, body, ad))
        except Exception as exc:  # cryptography's InvalidTag
            failed = exc
        try:  # sealed by the other algorithm (a store written before the switch)?
            return bytes(key.other().decrypt(nonce, body, ad))
        except ConfigurationError:
            pass  # this cryptography cannot do it: the record fails its tag here
        except Exception:
            pass
        raise CorruptTranscriptError(
            f"{where}: the sealed record fails its authentication tag (it was altered, or "
            "moved here from another conversation or position); nothing was changed",
            where=where, position=seq) from failed

    # text forms, for records a store keeps as strings --------------------------------
    def seal_text(self, kind: str, cid: str, seq: int | None, plaintext: str,
                  prev: str | None = None) -> str:
        sealed = self.seal(kind, cid, seq, plaintext.encode("utf-8", "surrogatepass"), prev)
        return b64.encode_text(sealed)

    def open_text(self, kind: str, cid: str, seq: int | None, stored: object,
                  where: str) -> str:
        try:
            raw = base64.b64decode(str(stored), validate=True)
        except ValueError as exc:
            raise CorruptTranscriptError(f"{where}: the sealed record is not base64; nothing "
                                         "was changed", where=where, position=seq) from exc
        return self.open(kind, cid, seq, raw, where).decode("utf-8", "surrogatepass")

    # blobs ---------------------------------------------------------------------------
    def seal_blob(self, data: bytes) -> bytes:
        return BLOB_MAGIC + self.seal("blob", "", None, data)

    def open_blob(self, stored: bytes, where: str) -> bytes:
        if not stored.startswith(BLOB_MAGIC):
            raise CorruptTranscriptError(f"{where}: not a sealed blob (an encrypted store "
                                         "holds only sealed blobs); nothing was changed",
                                         where=where)
        return self.open("blob", "", None, stored[len(BLOB_MAGIC):], where)



# the stored row of a sealed message without blobs (one definition: chatstate.stores.sealed and the
# stores that keep it as a binary row use these) --------------------------------------
ROW_HEAD = b'{"content":[{"data":"'
"""How the canonical body of a sealed message starts; its base64 data follows."""
ROW_TAIL_V1 = b'","type":"' + SEALED_PART.encode() + b'"}],'
ROW_TAIL = b'","type":"' + SEALED_PART.encode() + b'","v":%d}],' % CHAINED
"""Where the base64 data of a format 1 (the part has no ``v``) and of a format 2 record
ends (canonical JSON: sorted keys), so a load need not parse the row."""
ROW_MID = ROW_TAIL + b'"created_at":'
ROW_SEQ = b',"model":null,"params":null,"role":"event","seq":'
ROW_STATUS = b',"status":'
ROW_END = b',"turn_id":"sealed","usage":null}'
"""The canonical body of a format 2 sealed message without blobs is ``ROW_HEAD``, its
base64 data, ``ROW_MID``, its time (a JSON string), ``ROW_SEQ``, its seq, ``ROW_STATUS``,
its status (a JSON string), ``ROW_END`` (``Message.body()`` of it, written out)."""
BINARY_ROW = 0
"""The first byte of a binary row (sqlite, schema 10 on: ``m010_sealed_binary_rows``):
``BINARY_ROW``, the length n of the clear fields, the clear fields (the time and the
status as JSON strings, a newline between), then the sealed bytes themselves. It stands
for the canonical body above (``expand_row``: base64 and the fixed text put back), whose
hash the stored chain covers, so the chain and every keyless check are those of the text
row; a load with the key reads the sealed bytes straight out (no base64, a row ~40 %
smaller). No JSON text starts with a NUL."""
ROWS_PER_TAKE = 512
"""How many binary rows a store's ``sealed_rows`` hands over at a time: each chunk is
opened before the next is read, so the memory a long load touches is one chunk's rows,
not the whole conversation's again (fresh pages cost more than the copy into them)."""
Take = Callable[[list[bytes], list[bytes]], bool]
"""Where a store's ``sealed_rows`` hands the rows, a chunk at a time in seq order, as two
lists: each row's sealed bytes, and its clear fields (``clear_fields``); False: stop, the
load goes the verified way."""


def binary_row(clear: bytes, sealed: bytes) -> bytes | None:
    """The binary row of a sealed message whose clear fields (``clear_fields``) are
    ``clear`` (None: too long for one)."""
    if len(clear) > 255:
        return None
    return bytes((BINARY_ROW, len(clear))) + clear + sealed


def halves(raw: bytes) -> tuple[bytes, bytes] | None:
    """(the clear fields, the sealed bytes) of a binary row; None if it is not one."""
    if len(raw) < 2 or raw[0] != BINARY_ROW or len(raw) < 2 + raw[1]:
        return None
    at = raw[1] + 2
    return raw[2:at], raw[at:]


def unpacked(rows: list[bytes]) -> tuple[list[bytes], list[bytes]] | None:
    """(the sealed bytes, the clear fields) of binary rows; None if one is not one."""
    sealed: list[bytes] = []
    clears: list[bytes] = []
    add, add_clear = sealed.append, clears.append
    for raw in rows:
        split = halves(raw)
        if split is None:
            return None
        add_clear(split[0])
        add(split[1])
    return sealed, clears


def clear_fields(created_at: bytes, status: bytes) -> bytes:
    """A binary row's clear fields from its time and status as JSON strings."""
    return created_at + b"\n" + status


def expand_row(seq: int, raw: bytes) -> bytes:
    """The canonical body a binary row stands for (ValueError if it is not one)."""
    split = halves(raw)
    if split is None:
        raise ValueError("not a binary sealed row")
    created, sep, status = split[0].partition(b"\n")
    if not sep:
        raise ValueError("not a binary sealed row")
    return (ROW_HEAD + b64.encode(split[1]) + ROW_MID +
            created + ROW_SEQ + b"%d" % seq + ROW_STATUS + status + ROW_END)


def row_body(seq: int, raw: bytes) -> bytes:
    """The canonical body a stored row stands for: a binary row expanded, any other row
    (or one that only looks like a binary row) as it is."""
    if is_binary_row(raw):
        try:
            return expand_row(seq, raw)
        except ValueError:
            pass
    return raw


def is_binary_row(raw: object) -> bool:
    """Is this stored body a binary row (``binary_row``)?"""
    return isinstance(raw, bytes) and raw[:1] == b"\0"
