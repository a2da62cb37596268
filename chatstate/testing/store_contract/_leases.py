"""The store contract: writer leases, fenced writes, and ``create_leased``."""


from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    ConflictError,
    ConversationInUse,
    ConversationNotFound,
    CorruptTranscriptError,
    LeaseLost,
)
from chatstate.stores.base import (
    Leases,
    Store,
    create_leased,
)
from chatstate.testing.store_contract._base import (
    StoreCase,
    _state,
    new_conversation,
    partial_after,
    seal_chain,
)


class FencingCases(StoreCase):
    """Writer leases, and writes fenced with the lease's owner token (``Leases`` stores)."""

    @pytest.fixture
    def leased(self, store: Store) -> tuple[Any, Any, list[Message]]:
        """A conversation mid-reply, its lease held for 0.3 s: (store, lease, messages)."""
        if not isinstance(store, Leases):
            pytest.skip(f"{type(store).__name__} has no writer leases (chatstate.stores.Leases)")
        msgs = new_conversation(store, "c1", 2)
        store.save_partial("c1", partial_after(msgs[-1]))
        return store, store.acquire_lease("c1", term=0.3), msgs

    WRITES: ClassVar[dict[str, Callable[[Any, list[Message], str | None], None]]] = {
        "append": lambda s, msgs, fence: s.append("c1", seal_chain(1, msgs[-1]), fence=fence),
        "save_partial": lambda s, msgs, fence: s.save_partial(
            "c1", partial_after(msgs[-1], "more"), fence=fence),
        "clear_partial": lambda s, _msgs, fence: s.clear_partial("c1", fence=fence),
        "set_header": lambda s, _msgs, fence: s.set_header("c1", title="mine", fence=fence),
    }

    def test_one_live_writer_per_conversation(self, leased: Any, reopen: Any) -> None:
        first, lease, _ = leased
        second = reopen()
        with pytest.raises(ConversationInUse) as info:
            second.acquire_lease("c1", term=30)
        assert f"pid {os.getpid()}" in str(info.value)
        first.release_lease(lease)
        second.release_lease(second.acquire_lease("c1"))

    @pytest.mark.parametrize("write", sorted(WRITES))
    def test_a_fenced_write_by_the_owner_lands(self, leased: Any, write: str) -> None:
        store, lease, msgs = leased
        before = _state(store, "c1")
        self.WRITES[write](store, msgs, lease.owner)
        assert _state(store, "c1") != before

    @pytest.mark.parametrize("write", sorted(WRITES))
    def test_a_fenced_write_after_a_takeover_is_refused(self, leased: Any, reopen: Any,
                                                        write: str) -> None:
        store, lease, msgs = leased
        time.sleep(0.5)  # our lease lapsed (we stalled): another writer takes it
        reopen().acquire_lease("c1", term=30)
        before = _state(store, "c1")
        with pytest.raises(LeaseLost):
            self.WRITES[write](store, msgs, lease.owner)
        assert _state(reopen(), "c1") == before

    def test_a_lapsed_lease_nobody_took_still_fences_for_its_writer(self,
                                                                    leased: Any) -> None:
        store, lease, msgs = leased
        time.sleep(0.5)
        self.WRITES["append"](store, msgs, lease.owner)
        assert len(store.load("c1").messages) == 3

    def test_unfenced_writes_pass_a_held_lease(self, leased: Any, reopen: Any) -> None:
        store, _lease, msgs = leased
        other = reopen()
        self.WRITES["append"](other, msgs, None)  # migrate, import: still compare-and-append
        with pytest.raises(ConflictError):
            self.WRITES["append"](other, msgs, None)
        assert len(store.load("c1").messages) == 3


class CreateLeasedCases(StoreCase):
    """A conversation started in one step: lease, header and first messages
    (``chatstate.stores.base.create_leased``: the store's own ``CreatesLeased`` method,
    or the three calls composed for a store without it)."""

    def test_create_leased_writes_the_header_the_messages_and_holds_the_lease(
            self, store: Store, reopen: Any) -> None:
        msgs = seal_chain(2)
        lease = create_leased(store, Conversation(id="c1", title="hi", metadata={"k": 1}),
                              msgs, owner="me-1")
        conv = reopen().load("c1")
        assert (conv.title, conv.metadata, conv.messages) == ("hi", {"k": 1}, msgs)
        if not isinstance(store, Leases):
            assert lease is None
            return
        assert lease.owner == "me-1"
        with pytest.raises(ConversationInUse):
            reopen().acquire_lease("c1", term=30)
        store.append("c1", seal_chain(1, msgs[-1]), fence=lease.owner)  # it fences
        store.release_lease(lease)
        reopen().release_lease(reopen().acquire_lease("c1"))

    def test_create_leased_with_no_messages_is_create(self, store: Store) -> None:
        lease = create_leased(store, Conversation(id="c1", title="empty"), [])
        assert store.load("c1").messages == []
        if isinstance(store, Leases):
            store.release_lease(lease)

    def test_create_leased_on_an_existing_id_conflicts_and_writes_nothing(
            self, store: Store, reopen: Any) -> None:
        msgs = new_conversation(store, "c1", 1, title="first")
        before = _state(store, "c1")
        with pytest.raises(ConflictError):
            create_leased(store, Conversation(id="c1", title="second"), seal_chain(2),
                          owner="me-2")
        assert _state(reopen(), "c1") == before
        assert store.load("c1").messages == msgs
        if isinstance(store, Leases):  # no lease left behind
            reopen().release_lease(reopen().acquire_lease("c1"))

    def test_create_leased_under_a_live_lease_writes_nothing(self, store: Store,
                                                            reopen: Any) -> None:
        if not isinstance(store, Leases):
            pytest.skip(f"{type(store).__name__} has no writer leases")
        other = reopen()
        held = other.acquire_lease("c1", term=30)
        with pytest.raises(ConversationInUse):
            create_leased(store, Conversation(id="c1"), seal_chain(2), owner="me-3")
        with pytest.raises(ConversationNotFound):
            reopen().load("c1")
        other.release_lease(held)

    @pytest.mark.parametrize("bad", ["from seq 1", "unsealed"])
    def test_create_leased_with_a_broken_chain_writes_nothing(self, store: Store,
                                                             reopen: Any, bad: str) -> None:
        msgs = seal_chain(3)
        batch = msgs[1:] if bad == "from seq 1" else \
            [msgs[0], msgs[1].model_copy(update={"content": "edited"})]
        with pytest.raises((ConflictError, CorruptTranscriptError)):
            create_leased(store, Conversation(id="c1"), batch, owner="me-4")
        with pytest.raises(ConversationNotFound):
            reopen().load("c1")
        if isinstance(store, Leases):
            reopen().release_lease(reopen().acquire_lease("c1"))


