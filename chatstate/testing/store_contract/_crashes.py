"""The store contract: writers killed with SIGKILL and writers racing, each a child
process (this package run with ``python -m`` is that child)."""


from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from chatstate.core.transcript import Message
from chatstate.errors import (
    ConflictError,
)
from chatstate.stores import open_store, register, store_class
from chatstate.stores.base import (
    Store,
)
from chatstate.testing.store_contract._base import (
    StoreCase,
    new_conversation,
    partial_after,
    seal_chain,
)


class CrashCases(StoreCase):
    """A writer killed at any instant loses nothing it was told is stored."""

    def test_a_killed_writer_loses_nothing_acknowledged(self, store_url: str) -> None:
        store = self.open(store_url)
        new_conversation(store, "crash", 1)
        store.close()
        acks = _crash(self, store_url, "crash", 30)
        store = self.open(store_url)  # a fresh store object, from the URL
        conv = store.load("crash")
        assert conv.verify() is None
        assert len(conv.messages) >= 1 + len(acks)
        for seq, digest in acks:
            assert conv.messages[seq].hash == digest, f"acknowledged seq {seq} lost"
        if conv.partial is not None:
            assert conv.partial.seq == conv.last_seq + 1
        store.append("crash", seal_chain(1, conv.last))  # and it takes the next write
        store.close()

    def test_the_partial_reply_of_a_killed_writer_survives(self, store_url: str) -> None:
        store = self.open(store_url)
        msgs = new_conversation(store, "cut", 1)
        store.close()
        saved = _crash(self, store_url, "cut", 1, stall=True)
        store = self.open(store_url)
        conv = store.load("cut")
        assert conv.messages == msgs
        assert conv.partial is not None
        assert (conv.partial.seq, conv.partial.hash) == saved[0]
        store.close()





# -- child writers: the crash and race cases --------------------------------------------------


def _child(case: StoreCase, store_url: str, *args: str) -> subprocess.Popen[str]:
    """This module run as a writer in a process of its own, with the store class this
    process opens ``store_url`` with registered again there."""
    scheme = store_url.split("://", 1)[0]
    cls = store_class(scheme)
    target = f"{cls.__module__}:{cls.__qualname__}"
    if "<" in target or cls.__module__ == "__main__":
        pytest.skip(f"{target} cannot be imported by a child process: define the store class "
                    "at module level, in a module of its own")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "chatstate.testing.store_contract", scheme, target,
               store_url, "1" if case.allow_ephemeral else "", *args]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _crash(case: StoreCase, store_url: str, cid: str, acks: int, *,
           stall: bool = False) -> list[tuple[int, str]]:
    """Let a writer append to ``cid`` until it acknowledged ``acks`` messages (or, with
    ``stall``, saved one partial reply), then kill it; the (seq, hash) it acknowledged
    (with ``stall``: of the partial reply).

    Out of process: SIGKILL, at whatever instant it is writing. In process: the writer
    (a thread) is stopped and its store object dropped without ``close()``."""
    kind = "partial" if stall else "ack"
    if case.in_process:
        stop = threading.Event()
        said: list[str] = []
        thread = threading.Thread(target=_write_until, daemon=True, args=(
            case.open(store_url), cid, stall, said.append, stop.is_set))
        thread.start()
        deadline = time.monotonic() + 60
        while len(_acks(said, kind)) < acks and time.monotonic() < deadline:
            time.sleep(0.001)
        stop.set()
        thread.join(60)
        return _acks(said, kind)
    child = _child(case, store_url, "crash", cid, "stall" if stall else "")
    said = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            said.append(line)
            if len(_acks(said, kind)) >= acks:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=60)
    assert len(_acks(said, kind)) >= acks, f"the child writer stopped early:\n{err}"
    return _acks(said, kind)


def _acks(said: Sequence[str], kind: str = "ack") -> list[tuple[int, str]]:
    """(seq, hash) of every complete ``ack`` (or ``partial``) line a writer said."""
    out = []
    for line in said:
        parts = line.split()
        if line.endswith("\n") and len(parts) == 3 and parts[0] == kind:
            out.append((int(parts[1]), parts[2]))
    return out


def _write_until(store: Store, cid: str, stall: bool, say: Callable[[str], None],
                 stopped: Callable[[], bool]) -> None:
    """Append turns to ``cid`` (a partial reply saved before each reply), saying ``ack seq
    hash`` once each append returned; with ``stall``, save one partial and wait."""
    last = store.load(cid).last
    while not stopped():
        if last is None or last.role == "assistant":
            last = seal_chain(1, last, prefix="child")[0]
            store.append(cid, [last])
            say(f"ack {last.seq} {last.hash}\n")
            continue
        partial = partial_after(last, "part of a reply")
        store.save_partial(cid, partial)
        if stall:
            say(f"partial {partial.seq} {partial.hash}\n")
            while not stopped():
                time.sleep(0.01)
            return
        last = Message.seal(last, role="assistant", content="the reply", turn_id="t-p")
        store.append(cid, [last])
        say(f"ack {last.seq} {last.hash}\n")


def _contend(store: Store, cid: str, n: int, writer: str,
             sealed: Callable[[], None]) -> tuple[list[tuple[int, str]], int]:
    """Append ``n`` messages to ``cid``, reloading and resealing on ConflictError. Calls
    ``sealed`` once its first message is sealed, so that racers seal on one head."""
    acks: list[tuple[int, str]] = []
    conflicts = 0
    msg = seal_chain(1, store.load(cid).last, prefix=writer)[0]
    sealed()
    while len(acks) < n:
        try:
            store.append(cid, [msg])
            acks.append((msg.seq, msg.hash))
        except ConflictError:
            conflicts += 1
        msg = seal_chain(1, store.load(cid).last, prefix=writer)[0]
    return acks, conflicts


def _race(case: StoreCase, store_url: str, cid: str, n: int
          ) -> list[tuple[list[tuple[int, str]], int]]:
    """Two writers of ``n`` messages each, released at once: processes, or threads."""
    if case.in_process:
        barrier = threading.Barrier(2, timeout=60)
        results: list[tuple[list[tuple[int, str]], int]] = []

        def run(writer: str) -> None:
            results.append(_contend(case.open(store_url), cid, n, writer, sealed))

        def sealed() -> None:
            barrier.wait()

        threads = [threading.Thread(target=run, args=(w,)) for w in ("w1", "w2")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(results) == 2, "a racing writer failed"
        return results
    children = [_child(case, store_url, "contend", cid, str(n), w) for w in ("w1", "w2")]
    try:
        for child in children:  # each says "sealed" once its first message is sealed
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line == "sealed\n", line + (child.stderr.read() if child.stderr else "")
        for child in children:  # then release both at once, so that they really race
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outs = [child.communicate(timeout=120) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    for child, (_, err) in zip(children, outs, strict=True):
        assert child.returncode == 0, err
    return [(_acks(out.splitlines(keepends=True)), int(out.rsplit("conflicts ", 1)[1]))
            for out, _ in outs]


def _main(argv: list[str]) -> None:
    scheme, target, url, allow, mode, cid, *rest = argv
    register(scheme, target)
    store = open_store(url, allow_ephemeral=bool(allow))

    def say(line: str) -> None:
        sys.stdout.write(line)
        sys.stdout.flush()

    if mode == "crash":  # until SIGKILLed
        _write_until(store, cid, rest == ["stall"], say, lambda: False)
        return

    def sealed() -> None:
        say("sealed\n")
        if sys.stdin.readline().strip() != "go":
            sys.exit(1)

    acks, conflicts = _contend(store, cid, int(rest[0]), rest[1], sealed)
    say("".join(f"ack {seq} {digest}\n" for seq, digest in acks) + f"conflicts {conflicts}\n")

