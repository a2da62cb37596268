"""The s3 store: ``S3Store`` in ``store``, its private parts beside it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["S3Store"]

if TYPE_CHECKING:
    from chatstate.stores.s3.store import S3Store


def __getattr__(name: str) -> Any:  # lazy: the registry imports the backend only when used
    if name == "S3Store":
        from chatstate.stores.s3.store import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
