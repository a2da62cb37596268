"""The postgres store: ``PostgresStore`` in ``store``, its private parts beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["PostgresStore"]

if TYPE_CHECKING:
    from chatstate.stores.postgres.store import PostgresStore


def __getattr__(name: str) -> Any:  # lazy: the registry imports the backend only when used
    if name == "PostgresStore":
        from chatstate.stores.postgres.store import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
