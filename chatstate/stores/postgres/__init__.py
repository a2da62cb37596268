"""The postgres store: ``PostgresStore`` in ``store``, its private parts beside it."""

from __future__ import annotations

from chatstate.stores.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
