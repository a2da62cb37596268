"""Tier 4 disk faults: power loss, on a FUSE filesystem that forgets what was not fsynced.

``tests/support/lazyfs.py`` (run in a subprocess) keeps un-fsynced file data and
un-fsynced directory entries in memory only. A writer
(``tests/support/fault_writer.py hold``) appends turns to a store on it and prints an
ack after each append returns; it is SIGKILLed with its store open; then the
power is cut (the filesystem process is SIGKILLed and the mount dropped) and
the backing directory, which holds only what was made durable, is mounted
again. Every acknowledged message must be there, the chain valid, and a fresh
open must leave no temp file. Under ``tear`` the cut keeps part of each unsynced write instead of
dropping it whole (a torn prefix, on a page boundary, with a zeroed tail, or
pages out of order: ``tests/support/lazyfs.py``), and the same checks hold.

The streaming test cuts the power while a real child process
(``tests/support/stream_child.py``) streams a reply from the fake model over
HTTP into the store: every message acknowledged before the cut loads, the
stored reply holds everything that was shown and is a prefix of the model's
reply (a whole record, never garbage), and the next send completes.

SIGKILL alone cannot tell a store that fsyncs from one that does not: the page
cache survives a killed process. This tier can, and the last test proves it:
the same run with the JSON store's directory fsync switched off, or SQLite at
``PRAGMA synchronous=OFF``, loses acknowledged messages, and the check says so.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    turn_problems,
)
from support.stores import fresh_load, parse_acks
from support.stream_child import latest_replies
from support.tiers import need

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store
from chatstate.testing import FakeModel
from chatstate.testing._replies import FILLER

pytestmark = pytest.mark.slow

LAZYFS = TESTS_DIR / "lazyfs.py"
STREAMER = TESTS_DIR / "stream_child.py"
ROUNDS = 4
CUTS = 6  # power cuts per streaming run
WORDS = 40  # words per fake reply: at 10 ms a chunk, a cut can land mid-stream
TEARS = ("drop", "prefix", "page", "zero", "scatter")  # lazyfs.TEARS (it imports libfuse)


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

    def __init__(self, tmp: Path, tear: str = "drop", seed: int | None = None) -> None:
        self.disk, self.mnt, self.log = tmp / "disk", tmp / "mnt", tmp / "lazyfs.log"
        self.disk.mkdir()
        self.mnt.mkdir()
        self.tear = tear
        self.rng = random.Random(seed)
        self.proc: subprocess.Popen[bytes] | None = None

    def mount(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([PYTHON, str(LAZYFS), str(self.disk), str(self.mnt),
                                          "--tear", self.tear,
                                          "--seed", str(self.rng.randrange(1 << 30))],
                                         stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"lazyfs did not mount:\n{self.log.read_text()}")
            time.sleep(0.02)

    def cut_power(self) -> None:
        """Drop everything not yet durable: kill the filesystem, unmount, mount the disk again."""
        assert self.proc is not None
        # Answered after every earlier request: the disk holds the (torn) durable state now.
        with pytest.raises(FileNotFoundError):
            os.stat(self.mnt / ".lazyfs-power-cut")
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
def tear() -> str:
    """How a power cut treats unsynced writes; tests parametrize it over TEARS."""
    return "drop"


@pytest.fixture
def lazy(tmp_path: Path, tear: str) -> Iterator[LazyMount]:
    reason = fuse_unavailable()
    need("FUSE power-loss", reason is None, reason or "")
    require_tool("fusermount3", tier="FUSE power-loss")
    seed = os.environ.get("CHATSTATE_POWERLOSS_SEED")
    mount = LazyMount(tmp_path, tear, int(seed) if seed else None)
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
@pytest.mark.parametrize("tear", TEARS)
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
    print(f"{kind} ({lazy.tear}): {total} acknowledged messages survived {ROUNDS} power "
          f"cuts; {len(prev)} stored")


@pytest.mark.invariant(3)
@pytest.mark.parametrize(("kind", "flag"), [("json", "--no-log-fsync"),
                                            ("sqlite", "--sync-off")])
def test_the_check_catches_a_store_that_skips_fsync(lazy: LazyMount, kind: str,
                                                    flag: str) -> None:
    """The teeth: without the fsync of each log record (json: an append's only fsync;
    there is no rename, so no directory fsync) or with synchronous=OFF (sqlite),
    acknowledged messages are gone after the same cut, and ``after_fault`` says so."""
    url = store_url(kind, lazy)
    prev = populate(url)
    acks = kill_writer(start_writer(url, 3, flag), after="holding")
    assert len(acks) == 6
    lazy.cut_power()
    verdict = after_fault(url, CID, prev, acks)
    assert any("missing" in p for p in verdict.problems), verdict.problems
    assert stored(url) == prev  # what was durable before the writer started is still there


class Streamer:
    """tests/support/stream_child.py: a fork server whose children stream one reply each."""

    def __init__(self, url: str, base_url: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
        self.proc = subprocess.Popen([PYTHON, str(STREAMER), url, base_url],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.early: list[dict[str, Any]] = []
        assert self.next() == "ready", self.proc.communicate()[1][-2000:]

    def next(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"stream_child exited: {self.proc.communicate()[1][-2000:]}"
        return json.loads(line)

    def go(self, mode: str) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {CID} {mode}\n")
        self.proc.stdin.flush()
        while "pid" not in (item := self.next()):
            self.early.append(item)  # the forked writer may speak before its parent does
        return int(item["pid"])

    def until(self, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        """The writer's lines, read until ``done`` says so (or it stopped talking)."""
        out, self.early = self.early, []
        while not done(out) and not any("error" in x or x.get("end") for x in out):
            out.append(self.next())
        return out

    def reaped(self, pid: int) -> list[dict[str, Any]]:
        out = []
        while (item := self.next()).get("reaped") != pid:
            out.append(item)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def model_text(conv: Conversation, turn: str, text: str) -> bool:
    """``text`` is a prefix of a fake reply to ``turn``: "Echo: <its question>" and then
    whole or cut-off filler words, nothing else (no bytes of a torn record)."""
    question = next(m.content for m in conv.messages if m.role == "user" and m.turn_id == turn)
    head = f"Echo: {question}"
    if len(text) <= len(head):
        return head.startswith(text)
    if not text.startswith(head + " "):
        return False
    *words, last = text[len(head) + 1:].split(" ")
    return all(w in FILLER for w in words) and any(w.startswith(last) for w in FILLER)


def check_after_cut(conv: Conversation, before: list[str], lines: list[dict[str, Any]]) -> str:
    """The checks after one cut; returns where in the turn the cut landed."""
    errors = [x["error"] for x in lines if "error" in x]
    turn = next((x["turn"] for x in lines if "turn" in x), None)
    printed = "".join(x["d"] for x in lines if "d" in x)
    ended = any(x.get("end") for x in lines)
    assert conv.verify() is None, "the hash chain is broken after the cut"
    assert [m.hash for m in conv.messages][:len(before)] == before, \
        "a message durable before this round has gone"
    assert not turn_problems(conv.messages), turn_problems(conv.messages)
    if turn is None:
        return f"before the turn ({errors[0][:60] if errors else 'open'})"
    # The user message is acknowledged once stream() returns (persist before call).
    assert any(m.role == "user" and m.turn_id == turn for m in conv.messages), \
        f"the acknowledged user message of {turn} is gone"
    stored = latest_replies(conv).get(turn, "")
    assert stored.startswith(printed), (
        f"{turn}: {len(printed)} chars were shown but only {len(stored)} survived the cut "
        f"(stored {stored!r})")
    assert model_text(conv, turn, stored), f"{turn}: the stored reply is not the model's: " \
        f"{stored!r}"
    if ended:
        reply = [m for m in conv.messages if m.turn_id == turn and m.role == "assistant"][-1]
        assert (reply.status, reply.content) == ("complete", printed)
        return "after the reply"
    return "mid-stream" if printed else "before the first delta"


@pytest.mark.invariant(2)
@pytest.mark.parametrize("tear", TEARS)
@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_power_cut_mid_stream(lazy: LazyMount, kind: str, tear: str) -> None:
    """Cut the power after a random number of shown deltas (none, some, all), then SIGKILL
    the writer; CUTS times, then one send runs to the end on what the cuts left."""
    url = store_url(kind, lazy)
    rng = random.Random(lazy.rng.random())
    phases: Counter[str] = Counter()
    before: list[str] = []
    with FakeModel(chunk_delay=0.01, reply_words=WORDS) as fake:
        server = Streamer(url, fake.base_url)
        try:
            for rnd in range(CUTS):
                pid = server.go("retry" if rng.random() < 0.5 else "new")
                shown = rng.choice([0, rng.randrange(1, WORDS), WORDS + 10])
                lines = server.until(lambda out, k=shown: sum("d" in x for x in out) >= k
                                     and any("turn" in x for x in out))
                time.sleep(rng.uniform(0, 0.02))  # the writer goes on meanwhile
                lazy.cut_power()  # the disk stops first: later fsyncs fail with EIO
                os.kill(pid, signal.SIGKILL)
                lines += server.reaped(pid)
                conv = fresh_load(url, CID)
                try:
                    phases[check_after_cut(conv, before, lines)] += 1
                except AssertionError as exc:
                    raise AssertionError(f"cut {rnd} ({tear}): {exc}\n"
                                         f"{lazy.log.read_text()[-1500:]}") from exc
                before = [m.hash for m in conv.messages]
            pid = server.go("retry")  # the next send works
            lines = server.until(lambda out: False)
            os.kill(pid, signal.SIGKILL)
            lines += server.reaped(pid)
        finally:
            server.close()
    assert not [x for x in lines if "error" in x], lines
    assert next(x["found"] for x in lines if "found" in x)["verify"] is None
    conv = fresh_load(url, CID)
    assert check_after_cut(conv, before, lines) == "after the reply"
    assert conv.partial is None
    print(f"{kind} ({tear}): {CUTS} power cuts at {dict(phases)}; {len(conv.messages)} "
          "messages stored")
    assert phases["mid-stream"] >= 1 or phases["before the first delta"] >= 1, phases
