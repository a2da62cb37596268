"""Ctrl-C at any instant of a store write leaves the store whole and writable.

CI once caught the REPL's Ctrl-C landing just after SQLite's ``BEGIN IMMEDIATE``
returned: the transaction stayed open on the store's one connection, and the
partial reply, the lease release and every later write failed with "cannot start
a transaction within a transaction". Here real SIGINTs are sent to the main
thread at random instants inside store calls, hundreds of times, on every store.
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
from support.stores import fresh_load, seal_chain

from chatstate.core.transcript import Conversation, Message
from chatstate.durable.uninterruptible import uninterruptible
from chatstate.stores import open_store


class Armed:
    """A SIGINT handler that raises KeyboardInterrupt only while a store call runs."""

    def __init__(self) -> None:
        self.on = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.on:
            raise KeyboardInterrupt


@pytest.fixture
def armed() -> Iterator[Armed]:
    handler = Armed()
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield handler
    finally:
        signal.signal(signal.SIGINT, previous)


def sigint_after(delay: float) -> threading.Timer:
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(delay, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    return timer


def test_sigint_inside_the_block_is_delivered_when_it_ends(armed: Armed) -> None:
    armed.on = True
    reached_end = False
    with pytest.raises(KeyboardInterrupt), uninterruptible():
        signal.raise_signal(signal.SIGINT)
        reached_end = True
    assert reached_end
    assert signal.getsignal(signal.SIGINT) is armed  # the caller's handler is back


def test_a_custom_handler_gets_the_signal_once_and_an_ignored_one_stays_ignored() -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with uninterruptible():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            assert calls == []
        assert calls == [signal.SIGINT]  # two presses inside one write: one interrupt after
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with uninterruptible():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_outside_the_main_thread_it_does_nothing() -> None:
    seen: list[Any] = []

    def worker() -> None:
        with uninterruptible():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [before]


@pytest.mark.invariant(4)
def test_ctrl_c_storm_leaves_every_store_whole_and_writable(store_url: str,
                                                            armed: Armed) -> None:
    """Appends and partial saves, each hit by a SIGINT at a random instant within its
    usual duration; after each interrupt the next write must work, nothing acknowledged
    is lost, and a fresh open verifies the chain."""
    rng = random.Random(20261201)
    store = open_store(store_url)
    try:
        store.create(Conversation(id="c"))
        acked: list[Message] = []
        took: list[float] = []
        interrupted = errors = 0
        for i in range(2000):
            if interrupted >= 50 and len(acked) >= 50:
                break
            conv = store.load("c")
            prev = conv.messages[-1] if conv.messages else None
            if i % 3 == 2:
                msg = Message.seal(prev, role="assistant", content=f"partial {i}",
                                   turn_id=f"t{i}", status="partial")
                op = (store.save_partial, msg)
            else:
                msg = seal_chain(1, prev, prefix=f"w{i}")[0]
                op = (store.append, [msg])
            # every fourth call, and the first eight, measure how long a write takes now
            # (a loaded machine speeds up and slows down); the others get a SIGINT at a
            # random instant within 2.5 times the median of the last nine measured
            recent = sorted(took[-9:])
            delay = None if len(took) < 8 or i % 4 == 0 else \
                rng.uniform(0, 2.5 * recent[len(recent) // 2])
            timer = sigint_after(delay) if delay is not None else None
            started = _clock()
            try:
                armed.on = True
                try:
                    op[0]("c", op[1])  # type: ignore[operator]
                finally:
                    armed.on = False
                    if timer is not None:
                        timer.cancel()
                        timer.join()
                if timer is None:
                    took.append(_clock() - started)
                if isinstance(op[1], list):
                    acked.append(msg)
            except KeyboardInterrupt:
                interrupted += 1
            except Exception as exc:  # the defect: a write fails after an earlier Ctrl-C
                errors += 1
                raise AssertionError(f"write {i} failed after {interrupted} interrupts: "
                                     f"{exc}") from exc
        assert interrupted >= 40, interrupted  # the storm really hit
        assert len(acked) >= 40, len(acked)    # and writes still got through
        assert errors == 0
        last = store.load("c").messages
        store.append("c", seal_chain(1, last[-1] if last else None, prefix="after"))
    finally:
        store.close()
    stored = fresh_load(store_url, "c").messages  # a fresh open verifies the chain
    hashes = [m.hash for m in stored]
    assert [m.hash for m in acked] == [h for h in hashes if h in {m.hash for m in acked}]
    assert stored[-1].content == f"after {stored[-1].seq}"


def _clock() -> float:
    import time

    return time.perf_counter()


def test_ctrl_c_while_begin_waits_for_another_writer_leaves_no_transaction_open(
        tmp_path: Any, armed: Armed) -> None:
    """The CI failure, made certain: SIGINT arrives while BEGIN IMMEDIATE waits for
    another writer's lock, so it is raised the instant BEGIN returns."""
    import sqlite3

    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    try:
        store.create(Conversation(id="c"))
        first = seal_chain(1)
        store.append("c", first)
        other = sqlite3.connect(tmp_path / "s.db", isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # another process's write in progress
        release = threading.Timer(0.3, other.execute, ("COMMIT",))
        release.start()
        interrupt = sigint_after(0.1)
        armed.on = True
        try:
            with pytest.raises(KeyboardInterrupt):
                store.append("c", seal_chain(1, first[-1], prefix="cut"))
        finally:
            armed.on = False
            interrupt.join()
            release.join()
            other.close()
        assert not store.db.in_transaction  # type: ignore[attr-defined]
        conv = store.load("c")
        assert [m.content for m in conv.messages] == ["msg 0"]  # the cut write is absent
        store.append("c", seal_chain(1, first[-1], prefix="next"))  # and the next one works
    finally:
        store.close()
    assert [m.content for m in fresh_load(url, "c").messages] == ["msg 0", "next 1"]
