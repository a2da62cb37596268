"""Tier 4 disk faults: power loss, on a FUSE filesystem that forgets what was not fsynced.

``tests/support/lazyfs.py`` (run in a subprocess) keeps un-fsynced file data and
un-fsynced directory entries in memory only. A writer
(``tests/support/fault_writer.py hold``) appends turns to a store on it and prints an
ack after each append returns; it is SIGKILLed with its store open; then the
power is cut (the filesystem process is SIGKILLed and the mount dropped) and
the backing directory, which holds only what was made durable, is mounted
again. Every acknowledged message must be there, the chain valid, and a fresh
open must leave no temp file.

SIGKILL alone cannot tell a store that fsyncs from one that does not: the page
cache survives a killed process. This tier can, and the last test proves it:
the same run with the JSON store's directory fsync switched off, or SQLite at
``PRAGMA synchronous=OFF``, loses acknowledged messages, and the check says so.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.faultlib import (
    CID,
    PYTHON,
    TESTS_DIR,
    WRITER,
    after_fault,
    populate,
    require_tool,
    run,
)
from support.stores import parse_acks
from support.tiers import need

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store

pytestmark = pytest.mark.slow

LAZYFS = TESTS_DIR / "lazyfs.py"
ROUNDS = 4


def fuse_unavailable() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (no FUSE in this kernel or container)"
    if os.geteuid() != 0:
        return "mounting FUSE needs root here"
    try:
        import mfusepy  # noqa: F401  (loads libfuse at import)
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse3 ({exc}); run scripts/test-prereqs"
    return None


class LazyMount:
    """A lazyfs mount of ``tmp/disk`` at ``tmp/mnt`` that can lose power."""

    def __init__(self, tmp: Path) -> None:
        self.disk, self.mnt, self.log = tmp / "disk", tmp / "mnt", tmp / "lazyfs.log"
        self.disk.mkdir()
        self.mnt.mkdir()
        self.proc: subprocess.Popen[bytes] | None = None

    def mount(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([PYTHON, str(LAZYFS), str(self.disk), str(self.mnt)],
                                         stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"lazyfs did not mount:\n{self.log.read_text()}")
            time.sleep(0.02)

    def cut_power(self) -> None:
        """Drop everything not yet durable: kill the filesystem, unmount, mount the disk again."""
        assert self.proc is not None
        os.stat(self.mnt)  # answered after every earlier request: the disk is consistent now
        self.proc.kill()
        self.proc.wait()
        run("fusermount3", "-u", "-z", self.mnt)
        self.mount()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            run("fusermount3", "-u", self.mnt)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        run("fusermount3", "-u", "-z", self.mnt)


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[LazyMount]:
    reason = fuse_unavailable()
    need("FUSE power-loss", reason is None, reason or "")
    require_tool("fusermount3", tier="FUSE power-loss")
    mount = LazyMount(tmp_path)
    mount.mount()
    try:
        yield mount
    finally:
        mount.close()


def store_url(kind: str, mount: LazyMount) -> str:
    return f"json://{mount.mnt}/store" if kind == "json" else f"sqlite://{mount.mnt}/db/s.db"


def start_writer(url: str, turns: int, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen([PYTHON, str(WRITER), "hold", url, CID, str(turns), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_writer(proc: subprocess.Popen[str], *, after: str,
                delay: float = 0.0) -> list[tuple[int, str]]:
    """Read the writer's output until a line starts with ``after``, wait ``delay`` seconds
    (the writer goes on appending), SIGKILL it, and return every ack it printed."""
    assert proc.stdout is not None
    seen = []
    while not (line := proc.stdout.readline()).startswith(after):
        assert line, f"the writer died: {proc.communicate()[1][-2000:]}"
        seen.append(line)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    return parse_acks("".join(seen) + line + rest)


def stored(url: str) -> list[Message]:
    store = open_store(url)
    try:
        conv: Conversation = store.load(CID)
        return conv.messages
    finally:
        store.close()


@pytest.mark.invariant(3)
@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_acknowledged_messages_survive_power_loss(lazy: LazyMount, kind: str) -> None:
    """Round 0 kills a writer idling with its store open; later rounds kill it mid-append."""
    url = store_url(kind, lazy)
    prev = populate(url)
    rng = random.Random(os.environ.get("CHATSTATE_POWERLOSS_SEED"))
    total = 0
    for rnd in range(ROUNDS):
        if rnd == 0:
            acks = kill_writer(start_writer(url, 3), after="holding")
        else:
            proc = start_writer(url, 0)
            acks = kill_writer(proc, after=f"ack {len(prev) + rng.randrange(1, 6)} ",
                               delay=rng.uniform(0, 0.03))
        lazy.cut_power()
        verdict = after_fault(url, CID, prev, acks)
        assert not verdict.problems, f"round {rnd}: {verdict.problems}"
        prev = stored(url)
        total += len(acks)
    assert total >= ROUNDS * 2
    print(f"{kind}: {total} acknowledged messages survived {ROUNDS} power cuts; "
          f"{len(prev)} stored")


@pytest.mark.invariant(3)
@pytest.mark.parametrize(("kind", "flag"), [("json", "--no-dir-fsync"),
                                            ("sqlite", "--sync-off")])
def test_the_check_catches_a_store_that_skips_fsync(lazy: LazyMount, kind: str,
                                                    flag: str) -> None:
    """The teeth: without the directory fsync (json) or with synchronous=OFF (sqlite),
    acknowledged messages are gone after the same cut, and ``after_fault`` says so."""
    url = store_url(kind, lazy)
    prev = populate(url)
    acks = kill_writer(start_writer(url, 3, flag), after="holding")
    assert len(acks) == 6
    lazy.cut_power()
    verdict = after_fault(url, CID, prev, acks)
    assert any("missing" in p for p in verdict.problems), verdict.problems
    assert stored(url) == prev  # what was durable before the writer started is still there
