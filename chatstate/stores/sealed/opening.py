"""Opening a store with its key (``seal_opened``), marking it encrypted, and the checks
that say what an encrypted conversation or store is (``replay --verify``, ``doctor``)."""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any, Literal

from chatstate.core.transcript import Conversation
from chatstate.errors import (
    ConfigurationError,
    ConflictError,
)
from chatstate.stores._mark import MARKER_ID
from chatstate.stores._mark import marker as marker  # the mark's reader, for the drill and tools
from chatstate.stores.base import (
    Store,
)
from chatstate.stores.codec import (
    AEAD_GCM_SIV,
    AEAD_NAME,
    FP_BYTES,
    SEALED_META,
    SEALED_PART,
    AeadCodec,
)
from chatstate.stores.forwarding import ForwardingStore
from chatstate.stores.sealed.store import MARKER_TITLE, SealedStore


def mark_encrypted(store: Store, fingerprint: str, aead: str = AEAD_NAME) -> None:
    store.create(Conversation(id=MARKER_ID, title=MARKER_TITLE, metadata={
        "encryption": {"aead": aead, "format": 1, "key": fingerprint}}))


def algorithm_of(mark: dict[str, Any] | None) -> str:
    """What a store's records are sealed with: its mark says (a new store: ``AEAD_NAME``;
    a mark without the field is older than the field, and so GCM-SIV)."""
    return AEAD_NAME if mark is None else str(mark.get("aead", AEAD_GCM_SIV))



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
