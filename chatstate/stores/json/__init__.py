"""The json store: ``JsonStore`` in ``store``, its private parts beside it."""

from __future__ import annotations

from chatstate.stores.json.store import JsonStore

__all__ = ["JsonStore"]
