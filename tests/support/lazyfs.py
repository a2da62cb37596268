"""A test-only FUSE filesystem that loses whatever was not fsynced when the power is cut.

    python tests/support/lazyfs.py BACKING MOUNTPOINT [--tear MODE] [--seed N]
                                   (foreground; stat CUT, then SIGKILL it, to cut the power)

Jepsen's LazyFS idea, small: every file and directory lives in this process's
memory, in two versions. The *live* version is what processes see; the
*durable* version is what survives a power cut, and it is the only one written
to BACKING:

- file data (and size and mode) become durable on ``fsync``/``fdatasync`` of
  that file;
- directory entries (create, mkdir, rename, unlink) become durable on ``fsync``
  of their directory, so "a rename is durable only after fsync of its
  directory" (an entry made durable points at its inode's durable data, which
  may be empty if that was never fsynced: the zero-length file after a crash).

A power cut is SIGKILL of this process followed by an unmount: the live state
dies with it. Mounting BACKING again starts from exactly the durable state.
``BACKING`` is rewritten (not fsynced: this is a test double of a disk, not a
disk) only while a fsync is being answered, and the process is single-threaded,
so once a later request (a ``stat`` of the mount) has been answered, BACKING is
consistent and the process may be killed.

Tearing. A real disk does not always drop an unsynced write whole: a cut can
leave part of it. ``stat`` of ``MOUNTPOINT/.lazyfs-power-cut`` (``CUT``) is the
power cut: every file that a durable directory entry points at and whose live
data differs from its durable data keeps a torn version of the unsynced write,
as ``--tear`` says (``drop``, the default, keeps nothing):

- ``prefix``: the durable data overwritten by the live data up to a random byte;
- ``page``:   the same, the tear on a 4096-byte boundary (or at either end);
- ``zero``:   the file has its live size, but the live data only up to a random
  byte and zeros after it (the size reached the disk, the data did not);
- ``scatter``: each 4096-byte page of the unsynced range independently the live
  page or the old one (zeros past the old size), the size either: pages written
  out of order, so a later page (say the one holding a record's newline) can
  land while an earlier one does not.

Each file draws its own tear point, from ``--seed``, so a tear may also keep
nothing or everything. The ``stat`` fails with ENOENT once BACKING holds the
torn state; after it every fsync fails with EIO (the power is off: nothing more
reaches BACKING) and the process is to be SIGKILLed.

POSIX and flock locks are left to the kernel (local locks), which is what a
single-machine store needs. Hard links and symlinks are refused.
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

import mfusepy as fuse

CUT = "/.lazyfs-power-cut"
PAGE = 4096
TEARS = ("drop", "prefix", "page", "zero", "scatter")


def tear(durable: bytes, live: bytes, mode: str, rng: random.Random) -> bytes:
    """What a power cut leaves of a file whose data is ``live`` and last fsynced ``durable``."""
    start = next((i for i, (a, b) in enumerate(zip(durable, live, strict=False)) if a != b),
                 min(len(durable), len(live)))
    end = len(live)
    if mode == "drop" or start >= end:
        return durable
    if mode == "scatter":
        size = rng.choice([len(durable), end])
        old = durable.ljust(max(size, end), b"\0")
        out = bytearray(old[:start])
        for page in range(start // PAGE * PAGE, max(size, end), PAGE):
            lo, hi = max(page, start), page + PAGE
            out += (live if rng.random() < 0.5 else old)[lo:hi].ljust(
                min(hi, max(size, end)) - lo, b"\0")
        return bytes(out[:size])
    if mode == "page":
        cuts = [start, *range((start // PAGE + 1) * PAGE, end, PAGE), end]
        k = rng.choice(cuts)
    else:
        k = rng.randint(start, end)
    if mode == "zero":
        return live[:k] + b"\0" * (end - k)
    return live[:k] + durable[k:]


class Node:
    """One inode: its live state, and the state a power cut would leave."""

    _inos = itertools.count(2)

    def __init__(self, is_dir: bool, mode: int, ino: int | None = None) -> None:
        self.ino = ino or next(Node._inos)
        self.is_dir = is_dir
        self.mode = self.durable_mode = mode
        self.data = bytearray()
        self.durable_data = b""
        self.entries: dict[str, Node] = {}
        self.durable_entries: dict[str, Node] = {}
        self.links = 0
        self.mtime = time.time_ns()
        self.version = 0  # bumped whenever the durable data changes

    def attrs(self) -> dict[str, Any]:
        kind = stat.S_IFDIR if self.is_dir else stat.S_IFREG
        nlink = 2 + sum(n.is_dir for n in self.entries.values()) if self.is_dir else self.links
        return {"st_mode": kind | self.mode, "st_ino": self.ino, "st_nlink": nlink,
                "st_size": len(self.data), "st_uid": os.getuid(), "st_gid": os.getgid(),
                "st_atime": self.mtime, "st_mtime": self.mtime, "st_ctime": self.mtime,
                "st_blocks": (len(self.data) + 511) // 512, "st_blksize": 4096}


def load(path: Path) -> Node:
    """The durable tree stored in BACKING; live state starts equal to it."""
    st = path.stat()
    node = Node(path.is_dir(), stat.S_IMODE(st.st_mode))
    if node.is_dir:
        for child in sorted(path.iterdir()):
            sub = load(child)
            sub.links += 1
            node.entries[child.name] = node.durable_entries[child.name] = sub
    else:
        node.durable_data = path.read_bytes()
        node.data = bytearray(node.durable_data)
    return node


class LazyFS(fuse.Operations):  # type: ignore[misc]  # mfusepy is untyped
    use_ns = True

    def __init__(self, backing: Path, mode: str = "drop", seed: int | None = None) -> None:
        self.backing = backing
        self.mode = mode
        self.rng = random.Random(seed)
        self.off = False  # after the power cut
        self.torn: list[str] = []  # the files a cut left torn, for the log
        self.root = load(backing)
        self.root.ino = 1
        self.handles: dict[int, Node] = {}
        self._fh = itertools.count(1)
        self._mirrored: dict[str, tuple[int, int]] = {}

    # -- lookup --------------------------------------------------------------------------
    def _lookup(self, path: str) -> Node:
        node = self.root
        for part in [p for p in path.split("/") if p]:
            if not node.is_dir or part not in node.entries:
                raise fuse.FuseOSError(errno.ENOENT)
            node = node.entries[part]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head or "/")
        if not parent.is_dir:
            raise fuse.FuseOSError(errno.ENOTDIR)
        return parent, name

    def _node(self, path: str | None, fh: int | None) -> Node:
        if fh is not None and fh in self.handles:
            return self.handles[fh]
        if path is None:
            raise fuse.FuseOSError(errno.ENOENT)
        return self._lookup(path)

    def _handle(self, node: Node) -> int:
        fh = next(self._fh)
        self.handles[fh] = node
        return fh

    def _link(self, parent: Node, name: str, node: Node) -> None:
        old = parent.entries.get(name)
        if old is not None:
            old.links -= 1
        parent.entries[name] = node
        node.links += 1
        parent.mtime = time.time_ns()

    # -- durability ----------------------------------------------------------------------
    def power_cut(self) -> None:
        """Leave in BACKING what the tear mode says of every unsynced write, then go dark."""
        seen: set[int] = set()

        def walk(node: Node, where: str) -> None:
            for name, child in sorted(node.durable_entries.items()):
                if child.ino in seen:
                    continue
                seen.add(child.ino)
                if child.is_dir:
                    walk(child, f"{where}/{name}")
                    continue
                kept = tear(child.durable_data, bytes(child.data), self.mode, self.rng)
                if kept != child.durable_data:
                    self.torn.append(f"{where}/{name}: kept {len(kept)} of {len(child.data)} "
                                     f"bytes (durable {len(child.durable_data)})")
                    child.durable_data = kept
                    child.version += 1

        walk(self.root, "")
        self._mirror(self.root, self.backing)
        self.off = True
        print(f"power cut ({self.mode}): " + ("; ".join(self.torn) or "nothing torn"),
              file=sys.stderr, flush=True)

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        if self.off:
            raise fuse.FuseOSError(errno.EIO)
        node = self._node(path, fh)
        node.durable_data = bytes(node.data)
        node.durable_mode = node.mode
        node.version += 1
        self._mirror(self.root, self.backing)
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        if self.off:
            raise fuse.FuseOSError(errno.EIO)
        node = self._node(path, fh)
        node.durable_entries = dict(node.entries)
        self._mirror(self.root, self.backing)
        return 0

    def _mirror(self, node: Node, where: Path) -> None:
        """Make BACKING hold the durable tree below ``node``."""
        want = node.durable_entries
        for existing in list(where.iterdir()):
            child = want.get(existing.name)
            if child is None or child.is_dir != existing.is_dir():
                if existing.is_dir():
                    shutil.rmtree(existing)
                else:
                    existing.unlink()
                self._mirrored.pop(str(existing), None)
        for name, child in want.items():
            target = where / name
            if child.is_dir:
                target.mkdir(exist_ok=True)
                self._mirror(child, target)
            elif self._mirrored.get(str(target)) != (child.ino, child.version):
                target.write_bytes(child.durable_data)
                self._mirrored[str(target)] = (child.ino, child.version)
            os.chmod(target, child.durable_mode)

    # -- namespace -----------------------------------------------------------------------
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        if path == CUT:
            self.power_cut()
            raise fuse.FuseOSError(errno.ENOENT)
        return self._node(path, fh).attrs()

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        node = self._lookup(path)
        # with use_ino an entry needs its inode number: glibc skips d_ino 0
        return [(".", {"st_ino": node.ino}, 0), ("..", {"st_ino": 1}, 0),
                *((name, child.attrs(), 0) for name, child in node.entries.items())]

    def mkdir(self, path: str, mode: int) -> int:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise fuse.FuseOSError(errno.EEXIST)
        self._link(parent, name, Node(True, stat.S_IMODE(mode)))
        return 0

    def rmdir(self, path: str) -> int:
        parent, name = self._parent(path)
        node = self._lookup(path)
        if node.entries:
            raise fuse.FuseOSError(errno.ENOTEMPTY)
        del parent.entries[name]
        node.links -= 1
        return 0

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        parent, name = self._parent(path)
        node = Node(False, stat.S_IMODE(mode))
        self._link(parent, name, node)
        return self._handle(node)

    def unlink(self, path: str) -> int:
        parent, name = self._parent(path)
        node = self._lookup(path)
        del parent.entries[name]
        node.links -= 1
        parent.mtime = time.time_ns()
        return 0

    def rename(self, old: str, new: str) -> int:
        src, old_name = self._parent(old)
        dst, new_name = self._parent(new)
        node = self._lookup(old)
        target = dst.entries.get(new_name)
        if target is not None and target.is_dir and target.entries:
            raise fuse.FuseOSError(errno.ENOTEMPTY)
        del src.entries[old_name]
        node.links -= 1
        self._link(dst, new_name, node)
        src.mtime = time.time_ns()
        return 0

    def link(self, target: str, source: str) -> int:
        raise fuse.FuseOSError(errno.EPERM)

    def symlink(self, target: str, source: str) -> int:
        raise fuse.FuseOSError(errno.EPERM)

    def chmod(self, path: str | None, mode: int) -> int:
        self._node(path, None).mode = stat.S_IMODE(mode)
        return 0

    def chown(self, path: str | None, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        self._node(path, None).mtime = times[1] if times else time.time_ns()
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 20, "f_bfree": 1 << 19,
                "f_bavail": 1 << 19, "f_files": 1 << 16, "f_ffree": 1 << 15, "f_namemax": 255}

    # -- file data -----------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        node = self._lookup(path)
        if flags & os.O_TRUNC:
            node.data = bytearray()
        return self._handle(node)

    def opendir(self, path: str) -> int:
        return self._handle(self._lookup(path))

    def release(self, path: str | None, fh: int) -> int:
        self.handles.pop(fh, None)
        return 0

    def releasedir(self, path: str | None, fh: int) -> int:
        return self.release(path, fh)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        return bytes(self._node(path, fh).data[offset:offset + size])

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        node = self._node(path, fh)
        if len(node.data) < offset:
            node.data.extend(b"\0" * (offset - len(node.data)))
        node.data[offset:offset + len(data)] = data
        node.mtime = time.time_ns()
        return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        node = self._node(path, fh)
        del node.data[length:]
        node.data.extend(b"\0" * (length - len(node.data)))
        node.mtime = time.time_ns()
        return 0


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="lazyfs.py")
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint")
    parser.add_argument("--tear", choices=TEARS, default="drop")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    fs = LazyFS(args.backing.resolve(), args.tear, args.seed)
    fuse.FUSE(fs, args.mountpoint, foreground=True, nothreads=True, fsname="lazyfs",
              use_ino=True, hard_remove=True, attr_timeout=0, entry_timeout=0,
              negative_timeout=0)


if __name__ == "__main__":
    main(sys.argv[1:])
