"""What every group of the store contract's cases shares: the messages they write and
the ``StoreCase`` fixtures and settings (see ``chatstate.testing.store_contract``)."""


from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chatstate.core.fields import Role
from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store
from chatstate.stores.base import (
    Store,
)


def seal_chain(n: int, prev: Message | None = None, *, prefix: str = "msg",
               turn_id: str = "t-1") -> list[Message]:
    """``n`` sealed messages after ``prev``, alternating user/assistant, content "msg <seq>"."""
    out: list[Message] = []
    for _ in range(n):
        seq = 0 if prev is None else prev.seq + 1
        role: Role = "user" if seq % 2 == 0 else "assistant"
        prev = Message.seal(prev, role=role, content=f"{prefix} {seq}", turn_id=turn_id)
        out.append(prev)
    return out


def new_conversation(store: Store, cid: str = "c1", n: int = 0, **header: Any) -> list[Message]:
    """Create ``cid`` and append ``n`` messages (``seal_chain``) one by one; return them."""
    store.create(Conversation(id=cid, **header))
    msgs = seal_chain(n)
    for m in msgs:
        store.append(cid, [m])
    return msgs


def partial_after(prev: Message | None, content: str = "half a rep") -> Message:
    return Message.seal(prev, role="assistant", content=content, turn_id="t-p",
                        status="partial")


class StoreCase:
    """The fixtures and settings every group of cases shares (see the module docstring)."""

    allow_ephemeral = False
    in_process = False
    keyed_blob_addresses = False
    """True for an encrypted store: a blob's address is a keyed digest, not its sha256."""

    def blob_address(self, store: Any, data: bytes) -> str:
        """The address ``put_blob(data)`` will give (an encrypted store overrides this)."""
        return hashlib.sha256(data).hexdigest()

    def open(self, url: str) -> Any:
        return open_store(url, allow_ephemeral=self.allow_ephemeral)

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[Any]:
        opened = self.open(store_url)
        try:
            yield opened
        finally:
            opened.close()

    @pytest.fixture
    def reopen(self, store_url: str) -> Iterator[Callable[[], Any]]:
        """Open ``store_url`` again, as a fresh store object (closed after the case)."""
        opened: list[Any] = []

        def again() -> Any:
            opened.append(self.open(store_url))
            return opened[-1]

        yield again
        for each in opened:
            each.close()

    def damage(self, store_url: str, conversation_id: str, seq: int) -> None:
        """Edit message ``seq`` (content "msg <seq>") behind the store's back, leaving its
        stored hash, so the chain no longer verifies there."""
        pytest.skip(f"{type(self).__name__} has no damage(store_url, conversation_id, seq) "
                    "hook: implement it to prove damaged chains are refused")

    def damage_blob(self, store_url: str, sha256: str, how: str) -> None:
        """Make the stored blob ``how`` = "altered" (first byte changed) or "truncated"
        (its first 1000 bytes kept), behind the store's back."""
        pytest.skip(f"{type(self).__name__} has no damage_blob(store_url, sha256, how) "
                    "hook: implement it to prove damaged blobs are refused")


def _has(store: Store, part: type) -> bool:
    """``isinstance`` against an optional protocol part (without narrowing ``store``)."""
    return isinstance(store, part)


def _state(store: Store, cid: str) -> tuple[Any, ...]:
    """What a write to ``cid`` could change, to show that a refused one changed nothing."""
    conv = store.load(cid)
    return conv.title, conv.metadata, conv.messages, conv.partial

