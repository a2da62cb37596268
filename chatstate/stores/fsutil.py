"""Durable local file primitives, public for the rest of chatstate (batch, probe, survival).

The stores' own implementation lives in ``_files``; this module is the one face
that code outside ``chatstate.stores`` imports, so the stores may reorganise
their private modules freely.
"""

from __future__ import annotations

from ._files import (
    TMP_MARK,
    atomic_write,
    ensure_dir,
    fsync_dir,
    locked,
    os_error,
    read_bytes,
    remove_durably,
    sync_durably,
    temp_name,
    temp_target,
    write_all,
)

__all__ = ["TMP_MARK", "atomic_write", "ensure_dir", "fsync_dir", "locked", "os_error",
           "read_bytes", "remove_durably", "sync_durably", "temp_name", "temp_target",
           "write_all"]
