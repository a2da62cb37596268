"""The s3 store: ``S3Store`` in ``store``, its private parts beside it."""

from __future__ import annotations

from chatstate.stores.s3.store import S3Store

__all__ = ["S3Store"]
