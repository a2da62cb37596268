"""The one place where sqlite3 and OS errors of SQLite files (the sqlite store, the batch
ledger) become chatstate errors."""

from __future__ import annotations

import resource
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from chatstate.durable.files import UNCHANGED, os_error
from chatstate.errors import CorruptTranscriptError, StoreUnavailable

AT_COMMIT = ("The commit was not confirmed, so the write may or may not have landed: "
             "reload to see. A retry will not duplicate it.")

_ADVICE = {
    "SQLITE_IOERR_SHMSIZE": "no room for SQLite's shared-memory file (-shm): the disk is "
                            "probably full; free space and retry",
    "SQLITE_FULL": "the disk (or the database's size limit) is full: free space and retry",
    "SQLITE_IOERR": "an I/O error from the device: check the disk (dmesg) before retrying",
    "SQLITE_READONLY": "the database is read-only: check the file's permissions and mount",
    "SQLITE_CANTOPEN": "the database file cannot be opened: check the path and permissions",
    "SQLITE_BUSY": "another process holds the database lock: retry, or stop the other writer",
    "SQLITE_LOCKED": "the database is locked: retry, or stop the other writer",
    "SQLITE_PERM": "permission denied: check the file's ownership",
}


def _fsize_limited() -> bool:
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return soft != resource.RLIM_INFINITY


@contextmanager
def translate(path: Path, action: str, *, outcome: str = UNCHANGED) -> Iterator[None]:
    """``outcome`` says what a failure leaves behind: the default only before COMMIT."""
    try:
        yield
    except OSError as exc:
        raise os_error(exc, action, path, outcome=outcome) from exc
    except sqlite3.DatabaseError as exc:
        name = getattr(exc, "sqlite_errorname", "") or ""
        text = str(exc)
        if name.startswith("SQLITE_NOTADB") or "not a database" in text or \
                name.startswith("SQLITE_CORRUPT"):
            raise CorruptTranscriptError(
                f"{path}: not a usable SQLite database ({text}); the file was left as it is. "
                "Point the store at another file, or restore this one from a backup.",
                where=str(path)) from exc
        if isinstance(exc, sqlite3.IntegrityError):
            raise
        base = next((k for k in _ADVICE if name.startswith(k)), "")
        advice = _ADVICE.get(base, "check the disk and retry")
        if name.startswith("SQLITE_IOERR_WRITE") and _fsize_limited():
            # SQLite reports EFBIG as a plain write error; say the likelier cause first
            advice = "the file size limit (ulimit -f) was probably reached; otherwise " + advice
        raise StoreUnavailable(
            f"could not {action} {path}: {text} ({name or 'sqlite error'}); {advice}. "
            f"{outcome}") from exc
