"""The s3 store's blob area: ``blobs/<sha256>``, one immutable object per digest.

A blob is created with If-None-Match: * and never changed; finding it there
already is success (its name is its digest), and the same bytes are put again
to renew its Last-Modified, the age `chatstate gc` goes by. It is acknowledged by the object
store before ``put_blob`` returns, so before any segment naming it is written.
Loading a conversation HEADs each blob it names (in parallel): existence and
size; the digest is checked whenever the bytes are read.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import obstore

from chatstate.stores.blobs import blob_ref, checked_blob, refuse_damaged_blob, valid_digest
from chatstate.stores.s3._base import S3StoreBase
from chatstate.stores.s3._transport import Exists

BLOBS = "blobs"


def blob_key(sha256: str) -> str:
    return f"{BLOBS}/{valid_digest(sha256)}"


class S3Blobs(S3StoreBase):
    """S3Store's ``put_blob``, ``get_blob``, ``has_blob`` (see BlobStore)."""

    def put_blob(self, data: bytes, *, media_type: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        ref = blob_ref(data, media_type, name)
        try:
            self.io.put(blob_key(ref["sha256"]), data, create=True, action="store a blob at")
        except Exists:  # content-addressed: fine, unless it was damaged since
            refuse_damaged_blob(self._blob_where(ref["sha256"]), ref["sha256"],
                                self._blob_size(ref["sha256"]), len(data))
            # the same bytes again: renews its Last-Modified, young for `chatstate gc`
            self.io.put(blob_key(ref["sha256"]), data, action="store a blob at")
        return ref

    def list_blobs(self) -> list[tuple[str, int, float]]:
        """(sha256, size, age) of every blob object (CollectsBlobs), by Last-Modified."""
        now = datetime.now(timezone.utc)
        return [(key.rsplit("/", 1)[-1], int(size), (now - modified).total_seconds())
                for key, size, modified in self.io.objects(BLOBS)]

    def remove_blob(self, sha256: str, *, idle_for: float) -> bool:
        key = blob_key(sha256)
        with self.io._call("look up a blob at", key):
            try:
                modified = obstore.head(self.io.client, key)["last_modified"]
            except FileNotFoundError as exc:
                if "NoSuchBucket" in str(exc):
                    raise
                return False
        if (datetime.now(timezone.utc) - modified).total_seconds() < idle_for:
            return False
        self.io.delete([key], "remove a blob at")
        return True

    def get_blob(self, sha256: str) -> bytes:
        got = self.io.get(blob_key(sha256), "read a blob at")
        return checked_blob(self._blob_where(sha256), sha256,
                            got.data if got is not None else None)

    def has_blob(self, sha256: str) -> bool:
        return self._blob_size(sha256) is not None

    def _blob_size(self, sha256: str) -> int | None:
        key = blob_key(sha256)
        with self.io._call("look up a blob at", key):
            try:
                return int(obstore.head(self.io.client, key)["size"])
            except FileNotFoundError as exc:
                if "NoSuchBucket" in str(exc):
                    raise
                return None

    def _blob_sizes(self, digests: list[str]) -> dict[str, int]:
        sizes = self.pool.map(self._blob_size, digests)
        return {sha: size for sha, size in zip(digests, sizes, strict=True) if size is not None}

    def _blob_where(self, sha256: str) -> str:
        return self._where(f"{BLOBS}/{sha256}")
