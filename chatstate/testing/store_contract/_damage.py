"""The store contract: damage refused and never written over, and ``rewrite``."""


from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chatstate.core.transcript import Message
from chatstate.errors import (
    ConflictError,
    CorruptTranscriptError,
)
from chatstate.stores.base import (
    Rewrites,
    Store,
)
from chatstate.testing.store_contract._base import (
    StoreCase,
    _state,
    new_conversation,
    partial_after,
    seal_chain,
)


class DamageCases(StoreCase):
    """Damaged data is refused, named by position, and never written over."""

    def test_writes_onto_a_chain_that_does_not_verify_are_refused(
            self, store: Store, store_url: str, reopen: Any) -> None:
        msgs = new_conversation(store, "c1", 3)
        self.damage(store_url, "c1", 1)
        writer = reopen()  # a fresh writer, nothing cached
        writes: dict[str, Callable[[], Any]] = {
            "load": lambda: writer.load("c1"),
            "append": lambda: writer.append("c1", seal_chain(1, msgs[-1])),
            "save_partial": lambda: writer.save_partial("c1", partial_after(msgs[-1])),
            "set_header": lambda: writer.set_header("c1", title="renamed"),
        }
        for name, write in writes.items():
            with pytest.raises(CorruptTranscriptError) as info:
                write()
            assert info.value.position == 1, (name, str(info.value))
        with pytest.raises(CorruptTranscriptError) as again:
            reopen().load("c1")  # still there, as it was: nothing wrote over it
        assert again.value.position == 1
        assert [s.id for s in writer.list_conversations()] == ["c1"]  # listing still works


class RewriteCases(StoreCase):
    """Every message of a conversation replaced at once (``rekey`` in place). Optional, as
    ``Rewrites`` is: not part of ``StoreContract``; a store that implements ``Rewrites``
    mixes it in beside it."""

    @pytest.fixture
    def rewritable(self, store: Store) -> tuple[Any, list[Message]]:
        assert isinstance(store, Rewrites), (
            f"{type(store).__name__} does not implement chatstate.stores.Rewrites: mix "
            "RewriteCases only into the contract of a store that rewrites in place")
        return store, new_conversation(store, "c1", 3)

    def test_a_rewrite_swaps_every_message_and_the_chain_goes_on(
            self, rewritable: Any, reopen: Any) -> None:
        store, msgs = rewritable
        again = seal_chain(3, prefix="rewritten")
        store.rewrite("c1", again, expect=msgs[-1].hash)
        fresh = reopen()
        assert fresh.load("c1").messages == again
        more = seal_chain(1, again[-1])
        fresh.append("c1", more)
        assert store.load("c1").messages == [*again, *more]

    def test_a_rewrite_after_another_append_conflicts_and_changes_nothing(
            self, rewritable: Any, reopen: Any) -> None:
        store, msgs = rewritable
        reopen().append("c1", seal_chain(1, msgs[-1]))
        before = _state(store, "c1")
        with pytest.raises(ConflictError):
            store.rewrite("c1", seal_chain(3, prefix="stale"), expect=msgs[-1].hash)
        with pytest.raises(ConflictError):  # the right tip, but one message short
            store.rewrite("c1", seal_chain(3, prefix="short"), expect=before[2][-1].hash)
        assert _state(store, "c1") == before

    def test_a_rewrite_that_does_not_chain_is_refused(self, rewritable: Any) -> None:
        store, msgs = rewritable
        broken = seal_chain(3, prefix="broken")
        broken[1] = broken[1].model_copy(update={"content": "edited"})
        before = _state(store, "c1")
        with pytest.raises(CorruptTranscriptError):
            store.rewrite("c1", broken, expect=msgs[-1].hash)
        assert _state(store, "c1") == before


