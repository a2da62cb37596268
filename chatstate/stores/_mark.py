"""The encryption mark: how any store says it is encrypted, readable without the codec.

An encrypted store holds a conversation named ``MARKER_ID`` whose metadata names the
AEAD and the key's fingerprint (``chatstate.stores.sealed`` writes it). ``open_store``
reads it on every open, so that a plain open (no key configured) refuses an encrypted
store; it lives here, apart from the sealing code, so that such an open imports none
of that (a cold ``chatstate ask`` on a plain store).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chatstate.errors import ConversationNotFound

if TYPE_CHECKING:
    from chatstate.stores.base import Store

MARKER_ID = "chatstate.encryption"


def marker(store: Store) -> dict[str, Any] | None:
    """The store's encryption mark (``{"aead", "key", "format"}``), None for a plain store."""
    try:
        found = store.load(MARKER_ID)
    except ConversationNotFound:
        return None
    mark = found.metadata.get("encryption")
    return mark if isinstance(mark, dict) else {"key": "?"}
