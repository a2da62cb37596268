"""The memory store: ``MemoryStore`` in ``store``, the contract's reference implementation."""

from __future__ import annotations

from chatstate.stores.memory.store import MemoryStore

__all__ = ["MemoryStore"]
