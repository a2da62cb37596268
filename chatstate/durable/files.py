"""Durable local file primitives: atomic replace, directory fsync, advisory locks.

Every OSError is translated here into ``StoreUnavailable`` naming the path, what
failed and what to do. A write that failed after the rename is "outcome unknown":
callers retry idempotently, and a failed fsync is never retried as if it had
succeeded (the page cache may have dropped the dirty pages; the only honest
answer is an error).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from chatstate.errors import ConfigurationError, StoreUnavailable

TMP_MARK = ".tmp-"
ADVICE = {
    errno.ENOSPC: "the disk is full: free space and retry",
    errno.EDQUOT: "the disk quota is exhausted: free space and retry",
    errno.EROFS: "the filesystem is read-only: remount it read-write or choose another store",
    errno.EACCES: "permission denied: check the ownership and mode of the store directory",
    errno.EPERM: "operation not permitted: check the ownership of the store directory",
    errno.EIO: "an I/O error from the device: check the disk (dmesg) before retrying",
    errno.EMFILE: "this process has too many open files: raise `ulimit -n` or close some",
    errno.ENFILE: "the system has too many open files: close some and retry",
    errno.EFBIG: "the file size limit was reached (ulimit -f)",
}


UNCHANGED = "Previously stored data is unchanged; a retry will not duplicate."
RENAMED = ("The new data was already renamed into place, but is not known to be on stable "
           "storage: it may be lost in a power failure. A retry will not duplicate it.")
REMOVED = ("The file was already removed, but the removal is not known to be on stable "
           "storage: it may reappear after a power failure.")


def os_error(exc: OSError, action: str, path: str | os.PathLike[str], *,
             outcome: str = UNCHANGED) -> StoreUnavailable:
    """``outcome`` says what already happened: the default only before anything changed."""
    advice = ADVICE.get(exc.errno or 0, "check the disk and retry")
    return StoreUnavailable(f"could not {action} {os.fspath(path)}: {exc.strerror or exc} "
                            f"({errno.errorcode.get(exc.errno or 0, '?')}); {advice}. "
                            f"{outcome}")


def ensure_dir(path: Path) -> None:
    """Create ``path`` and any missing parents, each 0700 whatever the umask."""
    missing = []
    probe = path
    try:
        while not probe.is_dir() and probe != probe.parent:  # EACCES raises: a clear error
            if probe.exists():  # a file (or another non-directory) stands in the way
                raise ConfigurationError(
                    f"could not create directory {path}: {probe} is a file, not a "
                    "directory; give a path whose parts are directories, or move the file")
            missing.append(probe)
            probe = probe.parent
        for directory in reversed(missing):  # mkdir(parents=True) would make parents 0777 & ~umask
            directory.mkdir(mode=0o700, exist_ok=True)
            os.chmod(directory, 0o700)
            fsync_dir(directory.parent)
    except OSError as exc:
        raise os_error(exc, "create directory", path) from exc


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Data = bytes | Iterable[bytes]
"""What a write takes: bytes, or pieces of them written one after another, as they are
made (a long reply's record is never joined into one more copy to be written)."""


def pieces_of(data: Data) -> Iterable[bytes]:
    return [data] if isinstance(data, bytes) else data


def size_of(data: bytes | Sequence[bytes]) -> int:
    return sum(len(piece) for piece in pieces_of(data))


def write_all(fd: int, data: Data) -> None:
    for piece in pieces_of(data):
        view = memoryview(piece)
        while view:
            written = os.write(fd, view)
            view = view[written:]


def temp_name(target: Path) -> Path:
    """An unpredictable dot-named sibling; the target's name is inside so recovery can find it."""
    return target.with_name(f".{target.name}{TMP_MARK}{secrets.token_hex(8)}")


_TEMP_RE = re.compile(r"\.(?P<target>.+)" + re.escape(TMP_MARK) + r"[0-9a-f]{16}")


def temp_target(name: str) -> str | None:
    """The target file name if ``name`` is one of ``temp_name``'s, else None.

    Strict on purpose: a valid conversation id may itself start with a dot or contain
    ".tmp-", and recovery must never take such a transcript for a dead writer's debris.
    """
    match = _TEMP_RE.fullmatch(name)
    return match.group("target") if match else None


def atomic_write(target: Path, data: Data) -> None:
    """Replace ``target`` with ``data``, durably: temp, write, fsync, rename, fsync the directory.

    Returns only when both the file and the directory entry are on stable storage.
    """
    tmp = temp_name(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise os_error(exc, "create a temp file for", target) from exc
    try:
        try:
            os.fchmod(fd, 0o600)
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as exc:
        _discard(tmp)
        raise os_error(exc, "write", target) from exc
    except BaseException:  # data that could not be made (a piece of unencodable text)
        _discard(tmp)
        raise
    try:
        fsync_dir(target.parent)
    except OSError as exc:
        raise os_error(exc, "fsync the directory of", target, outcome=RENAMED) from exc


def sync_durably(path: Path) -> None:
    """fsync ``path`` and its directory.

    For a retry that finds its write already in place: that write's own fsync may
    have failed, so what is there now is acknowledged only after a fresh fsync.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(path.parent)
    except OSError as exc:
        raise os_error(exc, "fsync", path, outcome="The data is in place but is not known to "
                       "be on stable storage: it may be lost in a power failure. Retry.") from exc


def remove_durably(path: Path) -> bool:
    """Unlink ``path`` and fsync its directory. False if it was not there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise os_error(exc, "remove", path) from exc
    try:
        fsync_dir(path.parent)
    except OSError as exc:
        raise os_error(exc, "fsync the directory of", path, outcome=REMOVED) from exc
    return True


def _discard(path: Path) -> None:
    with suppress(OSError):
        path.unlink()


@contextmanager
def locked(lock_path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive advisory lock (flock) on ``lock_path``; yields False if not acquired.

    flock locks belong to the open file description, so they work across
    processes and threads alike and are released by the kernel when a holder dies.
    """
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise os_error(exc, "open the lock file", lock_path) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        except OSError as exc:
            raise os_error(exc, "lock", lock_path) from exc
        yield True
    finally:
        os.close(fd)


def read_bytes(path: Path) -> bytes | None:
    """The file's bytes, or None if absent."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error(exc, "read", path) from exc
