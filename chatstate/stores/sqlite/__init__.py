"""The sqlite store: ``SqliteStore`` in ``store``, its private parts beside it."""

from __future__ import annotations

from chatstate.stores.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
