"""The json store's partial-reply sidecar as an append-only log: one fsync per flush.

Rewriting the sidecar atomically costs two fsyncs (the temp file, then the
directory after the rename). Appending a whole record and its newline to a file
this process wrote costs one, and a crash mid-append leaves a last line without
its newline, which the reader ignores (``_jsondoc.decode_partial``). The file is
rewritten atomically when it is new, when anyone else touched it since our last
write (its inode, size or mtime differ), after a failed append (which is cut off
again, so the previous record stays the last line), and when it grows past
``limit``, so it stays O(reply).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

from chatstate.durable.files import os_error, size_of, write_all

Key = tuple[int, int, int]


def _key(st: os.stat_result) -> Key:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class SidecarLog:
    limit = 256 * 1024

    def __init__(self) -> None:
        self._known: dict[Path, Key] = {}
        self._seqs: dict[Path, int] = {}  # the seq of the last record this process wrote

    def wrote(self, path: Path, seq: int | None = None) -> None:
        """Record the state of a sidecar this process has just rewritten atomically
        (``seq``: the partial reply's)."""
        self._seqs.pop(path, None)
        try:
            self._known[path] = _key(os.stat(path))
        except OSError:
            self._known.pop(path, None)
        else:
            if seq is not None:
                self._seqs[path] = seq

    def seq_of(self, path: Path) -> int | None:
        """The seq of the partial in ``path`` when its last record is the one this
        process wrote and nobody touched the file since (so it need not be read back
        to be known); else None."""
        seq = self._seqs.get(path)
        if seq is None:
            return None
        try:
            return seq if self._known.get(path) == _key(os.stat(path)) else None
        except OSError:
            return None

    def append(self, path: Path, record: bytes | Sequence[bytes], seq: int | None = None
               ) -> bool:
        """Append ``record`` durably; False (nothing written) when it must be rewritten."""
        self._seqs.pop(path, None)
        known = self._known.pop(path, None)
        try:
            st = os.stat(path)
        except OSError:
            return False
        if known != _key(st) or st.st_size + size_of(record) > self.limit:
            return False
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            raise os_error(exc, "write", path) from exc
        try:
            write_all(fd, record)
            os.fsync(fd)
            self._known[path] = _key(os.fstat(fd))
            if seq is not None:
                self._seqs[path] = seq
        except OSError as exc:
            # Not acknowledged: cut the record off again so the previous one stays the
            # last line; should that fail too, the next flush rewrites the file whole.
            with suppress(OSError):
                os.ftruncate(fd, st.st_size)
            raise os_error(exc, "write", path) from exc
        except BaseException:  # a piece that could not be made (unencodable text): undo
            with suppress(OSError):
                os.ftruncate(fd, st.st_size)
            raise
        finally:
            os.close(fd)
        return True
