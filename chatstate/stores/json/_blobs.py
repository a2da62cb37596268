"""The json store's blob area: ``DIR/blobs/<sha256>``, one immutable file per digest.

Written like every other file of the store (temp file, fsync, rename, fsync the
directory; 0600 files in a 0700 directory), under one store-wide lock
(``.locks/blobs.lock``) so that ``open()`` can tell a dead writer's temp file
from a live one. A blob is never rewritten: its name is its digest.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from chatstate.durable.files import (
    TMP_MARK,
    atomic_write,
    ensure_dir,
    locked,
    os_error,
    read_bytes,
    remove_durably,
    sync_durably,
)
from chatstate.stores.blobs import blob_ref, checked_blob, refuse_damaged_blob, valid_digest


class JsonBlobs:
    """Mixed into JsonStore: ``put_blob``, ``get_blob``, ``has_blob`` (see BlobStore)."""

    root: Path
    recovery: list[str]

    @property
    def _blobs(self) -> Path:
        return self.root / "blobs"

    def _blob_lock(self) -> Path:
        return self.root / ".locks" / "blobs.lock"

    def blob_path(self, sha256: str) -> Path:
        return self._blobs / valid_digest(sha256)

    def put_blob(self, data: bytes, *, media_type: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        ref = blob_ref(data, media_type, name)
        path = self.blob_path(ref["sha256"])
        ensure_dir(self._blobs)
        with locked(self._blob_lock()):
            held = self._blob_size(ref["sha256"])
            refuse_damaged_blob(str(path), ref["sha256"], held, len(data))
            if held is None:
                atomic_write(path, data)
            else:
                os.utime(path)  # stored again: young for `chatstate gc`
                sync_durably(path)  # a writer killed before its fsync may have left it
        return ref

    def list_blobs(self) -> list[tuple[str, int, float]]:
        """(sha256, size, age) of every blob file (CollectsBlobs); temp files left out."""
        if not self._blobs.is_dir():
            return []
        now, out = time.time(), []
        for entry in os.scandir(self._blobs):
            if TMP_MARK in entry.name or entry.name.startswith("."):
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            out.append((entry.name, st.st_size, now - st.st_mtime))
        return out

    def remove_blob(self, sha256: str, *, idle_for: float) -> bool:
        path = self.blob_path(sha256)
        with locked(self._blob_lock()):  # put_blob renews under this lock
            try:
                if time.time() - os.stat(path).st_mtime < idle_for:
                    return False
            except FileNotFoundError:
                return False
            remove_durably(path)
        return True

    def get_blob(self, sha256: str) -> bytes:
        path = self.blob_path(sha256)
        return checked_blob(str(path), sha256, read_bytes(path))

    def has_blob(self, sha256: str) -> bool:
        return self._blob_size(sha256) is not None

    def _blob_size(self, sha256: str) -> int | None:
        try:
            return os.stat(self.blob_path(sha256)).st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise os_error(exc, "stat", self.blob_path(sha256)) from exc

    def _blob_where(self, sha256: str) -> str:
        return str(self._blobs / sha256)

    def _remove_blob_temps(self) -> None:
        """Remove temp files of blob writers killed before their rename (we hold the lock)."""
        if not self._blobs.is_dir():
            return
        with locked(self._blob_lock(), blocking=False) as got:
            if not got:
                return
            for tmp in sorted(self._blobs.glob(f".*{TMP_MARK}*")):
                remove_durably(tmp)
                self.recovery.append(f"removed blobs/{tmp.name}, a temp file left by a killed "
                                     "writer")
