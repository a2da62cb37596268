"""ForwardingStore, the typed base of every store wrapper: a valid store with its inner's parts.

Proves, per store: a wrapper is a ``Store`` and has exactly the optional parts
(``BlobStore``, ``Leases``, ``PacesPartials`` ...) its inner store has, no more, with
their attributes forwarded; a ``Chat`` turn through it lands in the inner store;
every forwarded method call passes the one ``_call`` hook, and a wrapper's own
methods win over the forwarded ones; an unfenced write passes no ``fence`` keyword
at all (an inner store written before fencing still takes it), a fenced one does;
batch's ``SerialisedStore`` never lets two calls overlap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import pytest
from support.stores import new_conversation, seal_chain

from chatstate.batch._work import SerialisedStore
from chatstate.core.transcript import Conversation
from chatstate.session.chat import Chat
from chatstate.stores import base
from chatstate.stores.forwarding import _MIXINS, ForwardingStore
from chatstate.testing import FakeModel

P = ParamSpec("P")
T = TypeVar("T")
OPTIONAL = sorted(_MIXINS, key=lambda part: part.__name__)


class Calls(ForwardingStore):
    """Records (method name, keyword arguments) of every forwarded call."""

    def __init__(self, inner: base.Store) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _call(self, method: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.calls.append((getattr(method, "__name__", "?"), dict(kwargs)))
        return method(*args, **kwargs)


@pytest.mark.parametrize("part", OPTIONAL, ids=lambda part: part.__name__)
def test_a_wrapper_has_exactly_the_parts_of_its_store(store: Any, part: type) -> None:
    wrapper = ForwardingStore(store)
    assert isinstance(wrapper, base.Store)
    assert isinstance(wrapper, part) == isinstance(store, part)
    twice = ForwardingStore(wrapper)
    assert isinstance(twice, part) == isinstance(store, part)


def test_a_wrapper_forwards_the_optional_attributes(store: Any) -> None:
    wrapper = ForwardingStore(store)
    assert wrapper.url == store.url
    assert wrapper.recovery is store.recovery
    assert isinstance(wrapper, base.OpenedStore)  # open_store set it on the inner store
    assert wrapper.guard_report is store.guard_report
    assert isinstance(wrapper, base.PacesPartials)  # every built-in store says its pace
    assert wrapper.partial_flush_interval == store.partial_flush_interval
    if isinstance(store, base.OpensReadOnly):
        assert isinstance(wrapper, base.OpensReadOnly)
        assert wrapper.read_only_reason is None


def test_a_wrapper_of_a_store_without_a_part_does_not_claim_it(store: Any) -> None:
    class Blobless(ForwardingStore):
        @classmethod
        def parts(cls, inner: base.Store) -> list[type]:
            return [p for p in super().parts(inner) if p not in (base.BlobStore,
                                                                   base.CollectsBlobs)]

    wrapper = Blobless(store)
    assert not isinstance(wrapper, base.BlobStore)
    assert not hasattr(wrapper, "put_blob")
    assert isinstance(wrapper, base.Leases) == isinstance(store, base.Leases)
    assert isinstance(ForwardingStore(wrapper), base.BlobStore) is False
    assert type(wrapper).__name__ == "Blobless"


@pytest.mark.usefixtures("no_model_settings_from_env")
def test_a_chat_turn_through_a_wrapper_lands_in_the_store(store: Any) -> None:
    wrapper = Calls(store)
    with FakeModel(reply_words=3) as fake:
        chat = Chat(wrapper, conversation_id="c1", base_url=fake.base_url, model="fake-model",
                    api_key="sk-test-forwarding-0123456789", title="t")
        reply = chat.send("hello")
    assert store.load("c1").messages[-1] == reply
    names = [name for name, _ in wrapper.calls]
    assert {"create", "append", "load"} <= set(names)
    if isinstance(store, base.Leases):  # the lease goes through the hook like the rest
        assert "acquire_lease" in names
        assert "release_lease" in names


def test_the_wrappers_own_methods_win(store: Any) -> None:
    new_conversation(store, "c1", 2)

    class Hidden(ForwardingStore):
        def load(self, conversation_id: str) -> Conversation:
            return Conversation(id=conversation_id, title="from the wrapper")

        def has_blob(self, sha256: str) -> bool:
            return True

    wrapper = Hidden(store)
    assert wrapper.load("c1").title == "from the wrapper"
    assert wrapper.has_blob("0" * 64) is True
    assert len(ForwardingStore(wrapper).inner.inner.load("c1").messages) == 2


def test_fence_is_passed_only_when_there_is_one(store: Any) -> None:
    recorder = Calls(store)
    wrapper = ForwardingStore(recorder)
    wrapper.create(Conversation(id="c1"))
    wrapper.append("c1", seal_chain(1))
    wrapper.set_header("c1", title="x")
    assert recorder.calls[-2:] == [("append", {}),
                                   ("set_header", {"title": "x", "metadata": None})]


def test_a_fenced_write_passes_the_fence() -> None:
    class Inner(ForwardingStore):
        def clear_partial(self, conversation_id: str, *, fence: str | None = None) -> None:
            seen.append(fence)

    seen: list[str | None] = []
    ForwardingStore(Inner(_unused_store())).clear_partial("c1", fence="owner-1")
    ForwardingStore(Inner(_unused_store())).clear_partial("c1")
    assert seen == ["owner-1", None]


def test_a_wrapper_cannot_be_made_from_a_url() -> None:
    with pytest.raises(TypeError, match="wraps a store that is open already"):
        ForwardingStore.from_url("sqlite:///x.db")


def test_serialised_store_calls_never_overlap(store: Any) -> None:
    new_conversation(store, "c1", 1)
    inside: list[int] = []
    overlaps: list[int] = []

    class Slow(ForwardingStore):
        def load(self, conversation_id: str) -> Conversation:
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(len(inside))
            time.sleep(0.01)
            try:
                return super().load(conversation_id)
            finally:
                inside.pop()

    serial = SerialisedStore(Slow(store))
    assert isinstance(serial, base.BlobStore) == isinstance(store, base.BlobStore)
    threads = [threading.Thread(target=lambda: [serial.load("c1") for _ in range(5)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []
    unserialised = ForwardingStore(Slow(store))  # the check itself sees overlaps
    threads = [threading.Thread(target=lambda: [unserialised.load("c1") for _ in range(5)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps != []


def _unused_store() -> base.Store:
    """A store object never opened: the test only looks at the calls made to it."""
    from chatstate.stores.json.store import JsonStore

    return JsonStore.from_url("json:///nonexistent-chatstate-test")


def test_create_leased_is_one_forwarded_call(store: Any) -> None:
    wrapper = Calls(store)
    msgs = seal_chain(2)
    lease = base.create_leased(wrapper, Conversation(id="c1"), msgs, owner="w-1")
    assert [name for name, _ in wrapper.calls] == ["create_leased"]
    assert store.load("c1").messages == msgs
    store.release_lease(lease)


def test_create_leased_goes_through_a_wrapper_that_changes_create_and_append(
        store: Any) -> None:
    seen: list[str] = []

    class Reporting(ForwardingStore):  # as the drill's: it reports each write it makes
        def create(self, conversation: Conversation) -> None:
            seen.append("create")
            super().create(conversation)

        def append(self, conversation_id: str, messages: Any, *,
                   fence: str | None = None) -> None:
            seen.append(f"append {len(messages)} fenced={fence is not None}")
            super().append(conversation_id, messages, fence=fence)

    msgs = seal_chain(2)
    lease = base.create_leased(Reporting(store), Conversation(id="c1"), msgs, owner="w-2")
    assert seen == ["create", "append 2 fenced=True"]
    assert store.load("c1").messages == msgs
    store.release_lease(lease)
