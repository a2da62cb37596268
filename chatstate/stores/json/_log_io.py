"""The file side of the json store's append log (``_log``): append one record, read the last."""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path

from chatstate.durable.files import Data, os_error, write_all
from chatstate.stores.json._log import DOC_END, last_record

UNKNOWN = ("The record may be in place but is not known to be on stable storage: it may be "
           "lost in a power failure. A retry will not duplicate it.")
TAIL = 64 * 1024


SCHEMA_AT = len(b'{"schema":')  # the document's one-digit schema version, at this offset


def append_record(path: Path, record: Data, key: tuple[int, int, int],
                  schema: int = 1) -> os.stat_result:
    """Write ``record`` at the end of ``path`` and fsync it: the append's one fsync.

    ``key`` (inode, mtime, size) is the file as the caller read and verified it,
    under the conversation's lock. On a failed write or fsync the record is cut off
    again, so the file is what it was; if even that fails, the outcome is unknown
    (a retry finds the record in place and fsyncs it, or rewrites nothing).
    ``schema``: what the record needs; a document that says less is raised to it in
    place (one byte), in the same fsync, so that an older chatstate refuses the file
    as newer rather than guessing at it.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)  # read: _raise_schema
    except OSError as exc:
        raise os_error(exc, "write", path) from exc
    try:
        size = key[2]
        try:
            write_all(fd, record)
            if schema > 1:
                _raise_schema(fd, path, schema)
            os.fsync(fd)
            return os.fstat(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, size)
            except OSError:
                raise os_error(exc, "write", path, outcome=UNKNOWN) from exc
            raise os_error(exc, "write", path) from exc
        except BaseException:  # a piece that could not be made (unencodable text): undo
            with suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        with suppress(OSError):
            os.close(fd)


def last_summary(path: Path) -> tuple[int, str] | tuple[()] | None:
    """(message count, updated_at) from the last whole log record of ``path``; ``()``
    when the file is a document alone; None when the tail does not say (read it whole)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - TAIL)
        fh.seek(start)
        tail = fh.read()
    if tail.endswith(DOC_END):
        return ()
    found = last_record(tail, whole=start == 0)
    if found is None:
        return None
    seq = found["messages"][-1].get("seq") if found["messages"] else None
    if not isinstance(seq, int):
        return None
    return seq + 1, found["at"]


def _raise_schema(appending: int, path: Path, schema: int) -> None:
    """The document's schema digit raised to ``schema`` if it says less. Read on the
    append's own descriptor (pread ignores O_APPEND); a second one, opened only when the
    digit must change, writes it (pwrite on an O_APPEND descriptor would append): an
    encrypted store's every append needs schema 2, which its document says already."""
    head = os.pread(appending, SCHEMA_AT + 2, 0)
    digit = head[SCHEMA_AT:SCHEMA_AT + 1]
    if head[SCHEMA_AT + 1:] != b"," or not digit.isdigit() or not int(digit) < schema < 10:
        return
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.pwrite(fd, b"%d" % schema, SCHEMA_AT)
    finally:
        os.close(fd)
