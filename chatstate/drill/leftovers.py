"""What a killed writer may leave behind, after a fresh open has recovered.

The drill asks the store itself: a store that implements the optional
``ReportsLeftovers`` part of the Store protocol (``leftovers``) says what it
finds for the drill's own conversations (the built-in stores: temp files and
held locks, a rollback journal, orphan objects); any other store reports
nothing. Only the drill's own conversations are looked at, so a user's chat
running on the same store at the same time cannot make the drill fail.

``cleanup`` deletes the drill's conversations, then lets a store that
implements ``forget`` drop their bookkeeping (the json store's lock files).
"""

from __future__ import annotations

from collections.abc import Sequence

from chatstate.errors import ChatstateError, ConversationNotFound
from chatstate.stores.base import Forgets, ReportsLeftovers, Store


def leftovers(store: Store, ids: Sequence[str], counts: dict[str, int]) -> list[str]:
    """Problems found; ``counts`` is the stored message count per conversation."""
    if isinstance(store, ReportsLeftovers):
        return store.leftovers(ids, counts)
    return []


def cleanup(store: Store, ids: Sequence[str]) -> list[str]:
    """Delete the drill's conversations (and their bookkeeping). Returns problems.

    The drill only ever uses ``ids``; it does not list the store, which would
    read the headers of the user's conversations.
    """
    problems = []
    for cid in ids:
        try:
            store.delete(cid)
        except ConversationNotFound:
            pass
        except ChatstateError as exc:
            problems.append(f"could not delete drill conversation {cid}: {exc}")
    if isinstance(store, Forgets):
        store.forget(ids)
    return problems
