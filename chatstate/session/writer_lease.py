"""Holding a store's writer lease for the length of a turn (the session's one hook).

``hold`` takes the conversation's lease before anything of the turn is written
and renews it from a daemon thread every third of its term (timed by the monotonic
clock, as takers judge its expiry: a wall clock step changes neither), so a slow model
(no chunk for a while) does not let it lapse; ``release`` gives it up when the
turn ends. When a renewal finds another writer holding the lease, ``lost`` says
so and the turn writer stops the turn (``LeaseLost``); a renewal that failed for
another reason (the store briefly unreachable) is tried again at the next tick.
A store without leases (a third-party one) is held by no one: the
compare-and-append still guarantees no lost turns.
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Any, cast

from chatstate.errors import ChatstateError, ConversationInUse, LeaseLost
from chatstate.stores.base import Leases, Store

log = logging.getLogger("chatstate.session")


class Held:
    """A lease being renewed until ``release()``; a no-op for stores without leases."""

    def __init__(self, store: Store, lease: Any) -> None:
        self.store = store
        self.lease = lease
        self.lost: ConversationInUse | LeaseLost | None = None
        """Set by the renewal thread when another writer took the lease over."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if lease is not None:
            self._thread = threading.Thread(target=self._renew, daemon=True,
                                            name=f"chatstate-lease-{lease.conversation_id}")
            self._thread.start()

    def _renew(self) -> None:
        leases = cast(Leases, self.store)  # a lease is only taken from a store with leases
        while not self._stop.wait(self.lease.term / 3):
            try:
                leases.renew_lease(self.lease)
            except (ConversationInUse, LeaseLost) as exc:  # taken over: the turn stops
                self.lost = exc
                log.warning("%s: another writer took the writer lease over: %s",
                            self.lease.conversation_id, exc)
                return
            except Exception as exc:  # tried again next tick; fenced writes still check
                log.warning("%s: could not renew the writer lease: %s",
                            self.lease.conversation_id, exc)

    def release(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            cast(Leases, self.store).release_lease(self.lease)
        except Exception as exc:  # it lapses by itself at the end of its term
            log.warning("%s: could not release the writer lease (it lapses by itself): %s",
                        self.lease.conversation_id, exc)


def hold(store: Store, conversation_id: str, owner: str, *, term: float,
         wait: float) -> Held:
    """Take the lease (ConversationInUse after ``wait`` seconds) and keep renewing it."""
    if not isinstance(store, Leases):
        return Held(store, None)
    lease = store.acquire_lease(conversation_id, term=term, wait=wait, owner=owner)
    return Held(store, lease)


def held_elsewhere(store: Store, conversation_id: str) -> ConversationInUse | None:
    """The live writer holding the conversation's lease right now, as the error a turn
    would get, or None (also for a store without leases).

    Then the conversation's partial reply is that writer's stream in progress, not a
    turn left interrupted. Found out by taking the lease under a fresh owner token and
    giving it back at once, so never ask it during one of your own turns. A store that
    cannot be written (full, read-only) cannot tell: None, and the turn says why.
    """
    if not isinstance(store, Leases):
        return None
    try:
        lease = store.acquire_lease(conversation_id, wait=0.0, owner=secrets.token_hex(8))
        store.release_lease(lease)
    except ConversationInUse as exc:
        return exc
    except ChatstateError as exc:
        log.debug("%s: could not look at the writer lease: %s", conversation_id, exc)
    return None
