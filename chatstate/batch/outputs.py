"""The output directory: file names, atomic writes, scans and the quarantine.

Every name in DIR that starts with a dot is chatstate's own (the ledger, temp
files of writes in progress, ``.quarantine/``); every other file is an output.
An output's name is a pure, injective function of its record id, flat in DIR:
characters outside ``[A-Za-z0-9._-]`` (and a leading dot) are percent-encoded,
so ``notes/a.txt`` becomes ``notes%2Fa.txt.txt`` and no id can name a path
outside DIR or a dot-file. Files are never deleted: a file in the way of an
output, or an output whose bytes changed, is moved to ``.quarantine/``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from chatstate.durable.files import atomic_write, ensure_dir, fsync_dir, os_error

SUFFIX = ".txt"
QUARANTINE = ".quarantine"
MAX_NAME = 200
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
# What stores.fsutil.temp_name makes: ".<target name>.tmp-<16 hex>"
TEMP_RE = re.compile(r"^\.(?P<target>.+)\.tmp-[0-9a-f]{16}$")


def output_name(record_id: str) -> str:
    """The output file name (relative to DIR) for ``record_id``; distinct ids, distinct names."""
    out = []
    for i, ch in enumerate(record_id):
        if ch in _SAFE and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    name = "".join(out) or "%"  # a bare '%' is no encoding's output either
    if len(name) > MAX_NAME:
        # '~' never appears in an encoded name, so a shortened name cannot equal a full one.
        digest = hashlib.sha256(record_id.encode("utf-8", "surrogatepass")).hexdigest()
        name = f"{name[:MAX_NAME - 33]}~{digest[:32]}"
    return name + SUFFIX


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str | None:
    """The file's sha256, or None if it is not there."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error(exc, "read", path) from exc
    return digest.hexdigest()


@dataclass
class Scan:
    files: set[str] = field(default_factory=set)
    """Outputs: every non-dot file under DIR (not under dot directories), relative, '/'-joined."""
    temps: dict[str, str] = field(default_factory=dict)
    """Temp files of unfinished writes: relative temp path -> relative target path."""


def scan(out_dir: Path) -> Scan:
    found = Scan()
    if not out_dir.is_dir():
        return found
    try:
        for root, dirs, files in os.walk(out_dir):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            base = Path(root).relative_to(out_dir)
            for name in files:
                rel = (base / name).as_posix()
                if not name.startswith("."):
                    found.files.add(rel)
                elif m := TEMP_RE.match(name):
                    found.temps[rel] = (base / m.group("target")).as_posix()
    except OSError as exc:
        raise os_error(exc, "list", out_dir) from exc
    return found


def quarantine(out_dir: Path, rel: str) -> str:
    """Move DIR/rel to DIR/.quarantine/rel (or rel.1, rel.2, ...); never overwrites or deletes.

    Returns the new path relative to DIR.
    """
    src = out_dir / rel
    for n in range(10_000):
        dest_rel = f"{QUARANTINE}/{rel}" + (f".{n}" if n else "")
        dest = out_dir / dest_rel
        ensure_dir(dest.parent)
        try:
            os.link(src, dest)  # fails if dest exists: no clobbering, even under a race
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise os_error(exc, "quarantine", src) from exc
            if dest.exists():
                continue
            try:
                os.rename(src, dest)  # filesystems without hard links
            except OSError as exc2:
                raise os_error(exc2, "quarantine", src) from exc2
        else:
            try:
                os.unlink(src)
            except OSError as exc:
                raise os_error(exc, "quarantine", src, outcome=f"A copy is already at {dest} "
                               "and the original is still in place.") from exc
        try:
            fsync_dir(dest.parent)
            fsync_dir(src.parent)
        except OSError as exc:
            raise os_error(exc, "fsync the quarantine of", src, outcome=f"It was moved to "
                           f"{dest}, but the move is not known to be on stable storage.") from exc
        return dest_rel
    raise os_error(OSError(errno.EEXIST, "too many quarantined copies"), "quarantine", src)


def write_output(out_dir: Path, rel: str, data: bytes) -> str | None:
    """Write DIR/rel atomically (temp, fsync, rename, fsync dir); durable when it returns.

    A different file already at DIR/rel is not ours to overwrite: it is quarantined
    first, and its new relative path returned.
    """
    target = out_dir / rel
    moved = None
    existing = file_sha256(target)
    if existing is not None and existing != sha256_hex(data):
        moved = quarantine(out_dir, rel)
    atomic_write(target, data)
    return moved


@dataclass(frozen=True)
class Written:
    """What a write did: ``moved`` a foreign file aside (local), or found the output ``taken``.

    ``taken`` is the sha256 of an output another worker already wrote (shared
    storage, create-only): this write was refused and changed nothing.
    """

    moved: str | None = None
    taken: str | None = None


class LocalOutputs:
    """The output directory on this host's disk (see the module docstring)."""

    shared = False

    def __init__(self, out_dir: Path) -> None:
        self.dir = out_dir
        self.where = str(out_dir)

    def prepare(self) -> None:
        ensure_dir(self.dir)

    def scan(self) -> Scan:
        return scan(self.dir)

    def sha256(self, rel: str) -> str | None:
        return file_sha256(self.dir / rel)

    def quarantine(self, rel: str) -> str:
        return quarantine(self.dir, rel)

    def remove_temp(self, rel: str) -> bool:
        from chatstate.durable.files import remove_durably

        return remove_durably(self.dir / rel)

    def write(self, rel: str, data: bytes) -> Written:
        return Written(moved=write_output(self.dir, rel, data))
