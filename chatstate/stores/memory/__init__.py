"""The memory store: ``MemoryStore`` in ``store``, the contract's reference implementation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["MemoryStore"]

if TYPE_CHECKING:
    from chatstate.stores.memory.store import MemoryStore


def __getattr__(name: str) -> Any:  # lazy: the registry imports the backend only when used
    if name == "MemoryStore":
        from chatstate.stores.memory.store import MemoryStore

        return MemoryStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
