"""A typed base for a store that wraps another: every call is forwarded to ``inner``.

A wrapper changes a few calls and forwards the rest: the drill's writer reports
each write on its pipe, the drill's checker answers one load from memory, batch
serialises calls. Subclass ``ForwardingStore`` and override the methods to
change, or ``_call``, through which every forwarded method call passes, to
change them all at once (attributes such as ``url`` are read directly).

The optional parts of the contract (``BlobStore``, ``Leases``, ``Searchable``,
``PacesPartials`` ... in ``chatstate.stores.base``) are found with
``isinstance``, so a wrapper must have exactly the parts its inner store has:
one around a store without a blob area must not claim one, one around an s3
store must keep its ``partial_flush_interval``. So ``SomeWrapper(inner)`` makes
its instance from a subclass of ``SomeWrapper`` that adds one forwarding mixin
per part ``inner`` has when it is wrapped (one class per combination, cached;
it keeps the wrapper's name, and the wrapper's own methods still win).
``parts`` decides which; a subclass may narrow it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar, cast

from chatstate.core.transcript import Conversation, ConversationSummary, Message
from chatstate.durable.guard import Report
from chatstate.stores.base import (
    LEASE_TERM,
    BlobStore,
    CheckReport,
    CollectsBlobs,
    CreatesLeased,
    Forgets,
    Leases,
    Location,
    OpenedStore,
    OpensReadOnly,
    PacesPartials,
    Quarantines,
    ReportsDurability,
    ReportsLeftovers,
    Searchable,
    Store,
    compose_create_leased,
)

P = ParamSpec("P")
T = TypeVar("T")
W = TypeVar("W", bound="ForwardingStore")


def _fenced(fence: str | None) -> dict[str, str]:
    """The ``fence`` keyword only for a fenced write: an unfenced call passes none at all,
    so an inner store written before fencing (no ``fence`` parameter) still takes it."""
    return {} if fence is None else {"fence": fence}


class _Forwarder:
    """What the forwarding mixins share: the one hook every forwarded call passes."""

    def _call(self, method: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``method`` (a method of the inner store) with these arguments."""
        return method(*args, **kwargs)


class ForwardingStore(_Forwarder):
    """A ``Store`` that forwards to ``inner``, with exactly the optional parts it has."""

    inner: Store

    def __new__(cls: type[W], inner: Store, *args: Any, **kwargs: Any) -> W:
        made: W = object.__new__(_composed(cls, tuple(cls.parts(inner))))
        return made

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    @classmethod
    def parts(cls, inner: Store) -> list[type]:
        """The optional parts the wrapper of ``inner`` has: those ``inner`` has. A subclass
        may leave some out (each must be one of the parts listed in ``_MIXINS``)."""
        return [part for part in _MIXINS if isinstance(inner, part)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    @classmethod
    def from_url(cls, url: str) -> Store:
        raise TypeError(f"{cls.__name__} wraps a store that is open already: wrap "
                        f"open_store({url!r}) instead")

    @property
    def url(self) -> str:
        return self.inner.url

    @url.setter
    def url(self, value: str) -> None:
        self.inner.url = value

    @property
    def recovery(self) -> list[str]:
        return self.inner.recovery

    @recovery.setter
    def recovery(self, value: list[str]) -> None:
        self.inner.recovery = value

    def location(self) -> Location:
        return self._call(self.inner.location)

    def open(self) -> None:
        self._call(self.inner.open)

    def close(self) -> None:
        self._call(self.inner.close)

    def create(self, conversation: Conversation) -> None:
        self._call(self.inner.create, conversation)

    def load(self, conversation_id: str) -> Conversation:
        return self._call(self.inner.load, conversation_id)

    def list_conversations(self, limit: int | None = None) -> list[ConversationSummary]:
        return self._call(self.inner.list_conversations, limit)

    def delete(self, conversation_id: str) -> None:
        self._call(self.inner.delete, conversation_id)

    def append(self, conversation_id: str, messages: Sequence[Message], *,
               fence: str | None = None) -> None:
        self._call(self.inner.append, conversation_id, messages, **_fenced(fence))

    def save_partial(self, conversation_id: str, partial: Message, *,
                     fence: str | None = None) -> None:
        self._call(self.inner.save_partial, conversation_id, partial, **_fenced(fence))

    def clear_partial(self, conversation_id: str, *, fence: str | None = None) -> None:
        self._call(self.inner.clear_partial, conversation_id, **_fenced(fence))

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None, fence: str | None = None) -> None:
        self._call(self.inner.set_header, conversation_id, title=title, metadata=metadata,
                   **_fenced(fence))

    def record_open(self, record: dict[str, Any]) -> None:
        self._call(self.inner.record_open, record)

    def opens(self) -> list[dict[str, Any]]:
        return self._call(self.inner.opens)

    def check(self) -> CheckReport:
        return self._call(self.inner.check)


# -- one mixin per optional part: mixed in only when the inner store has the part -----------


class _Blobs(_Forwarder):
    inner: BlobStore

    def put_blob(self, data: bytes, *, media_type: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        return self._call(self.inner.put_blob, data, media_type=media_type, name=name)

    def get_blob(self, sha256: str) -> bytes:
        return self._call(self.inner.get_blob, sha256)

    def has_blob(self, sha256: str) -> bool:
        return self._call(self.inner.has_blob, sha256)


class _CollectsBlobs(_Forwarder):
    inner: CollectsBlobs

    def list_blobs(self) -> list[tuple[str, int, float]]:
        return self._call(self.inner.list_blobs)

    def remove_blob(self, sha256: str, *, idle_for: float) -> bool:
        return self._call(self.inner.remove_blob, sha256, idle_for=idle_for)


class _Leases(_Forwarder):
    inner: Leases

    def acquire_lease(self, conversation_id: str, *, term: float = LEASE_TERM,
                      wait: float = 0.0, owner: str | None = None) -> Any:
        return self._call(self.inner.acquire_lease, conversation_id, term=term, wait=wait,
                          owner=owner)

    def renew_lease(self, lease: Any) -> None:
        self._call(self.inner.renew_lease, lease)

    def release_lease(self, lease: Any) -> None:
        self._call(self.inner.release_lease, lease)


class _CreatesLeased(_Forwarder):
    inner: CreatesLeased

    def create_leased(self, conversation: Conversation, messages: Sequence[Message], *,
                      owner: str | None = None, term: float = LEASE_TERM,
                      wait: float = 0.0) -> Any:
        """Forwarded as one call, unless the wrapper changes ``create`` or ``append`` (the
        drill's reporting store): then as those calls, through the wrapper's own."""
        cls = type(self)
        if getattr(cls, "create", None) is not ForwardingStore.create or \
                getattr(cls, "append", None) is not ForwardingStore.append:
            return compose_create_leased(cast(Store, self), conversation, messages,
                                         owner=owner, term=term, wait=wait)
        return self._call(self.inner.create_leased, conversation, messages, owner=owner,
                          term=term, wait=wait)


class _Quarantines(_Forwarder):
    inner: Quarantines

    def quarantine(self, conversation_id: str) -> str:
        return self._call(self.inner.quarantine, conversation_id)


class _Searchable(_Forwarder):
    inner: Searchable

    def search(self, text: str, limit: int = 50) -> list[tuple[str, int, str]]:
        return self._call(self.inner.search, text, limit)


class _ReportsLeftovers(_Forwarder):
    inner: ReportsLeftovers

    def leftovers(self, conversation_ids: Sequence[str],
                  counts: Mapping[str, int]) -> list[str]:
        return self._call(self.inner.leftovers, conversation_ids, counts)


class _Forgets(_Forwarder):
    inner: Forgets

    def forget(self, conversation_ids: Sequence[str]) -> None:
        self._call(self.inner.forget, conversation_ids)


class _ReportsDurability(_Forwarder):
    inner: ReportsDurability

    def durability_report(self) -> Report:
        return self._call(self.inner.durability_report)


class _OpensReadOnly(_Forwarder):
    inner: OpensReadOnly

    @property
    def read_only_reason(self) -> str | None:
        return self.inner.read_only_reason


class _PacesPartials(_Forwarder):
    inner: PacesPartials

    @property
    def partial_flush_interval(self) -> float:
        return self.inner.partial_flush_interval


class _Opened(_Forwarder):
    inner: OpenedStore

    @property
    def guard_report(self) -> Report:
        return self.inner.guard_report


_MIXINS: dict[type, type[_Forwarder]] = {
    BlobStore: _Blobs, CollectsBlobs: _CollectsBlobs, Leases: _Leases,
    CreatesLeased: _CreatesLeased,
    Quarantines: _Quarantines, Searchable: _Searchable, ReportsLeftovers: _ReportsLeftovers,
    Forgets: _Forgets, ReportsDurability: _ReportsDurability, OpensReadOnly: _OpensReadOnly,
    PacesPartials: _PacesPartials, OpenedStore: _Opened,
}


_COMPOSED: dict[tuple[type, tuple[type, ...]], type] = {}


def _composed(cls: type[W], parts: tuple[type, ...]) -> type[W]:
    """``cls`` with the forwarding mixin of each part (``cls`` itself when there are none)."""
    mixins = tuple(_MIXINS[part] for part in parts if not issubclass(cls, _MIXINS[part]))
    if not mixins:
        return cls
    key = (cls, mixins)
    if key not in _COMPOSED:  # two threads may both make it: one is kept
        _COMPOSED.setdefault(key, type(cls.__name__, (cls, *mixins), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__}))
    made: type[W] = _COMPOSED[key]
    return made
