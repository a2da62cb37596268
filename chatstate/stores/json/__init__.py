"""The json store: ``JsonStore`` in ``store``, its private parts beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["JsonStore"]

if TYPE_CHECKING:
    from chatstate.stores.json.store import JsonStore


def __getattr__(name: str) -> Any:  # lazy: the registry imports the backend only when used
    if name == "JsonStore":
        from chatstate.stores.json.store import JsonStore

        return JsonStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
