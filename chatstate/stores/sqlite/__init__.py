"""The sqlite store: ``SqliteStore`` in ``store``, its private parts beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["SqliteStore"]

if TYPE_CHECKING:
    from chatstate.stores.sqlite.store import SqliteStore


def __getattr__(name: str) -> Any:  # lazy: the registry imports the backend only when used
    if name == "SqliteStore":
        from chatstate.stores.sqlite.store import SqliteStore

        return SqliteStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
