"""The sqlite store commits writes from many threads together, and keeps each one whole.

Writes that queue up while one is in progress join its transaction, each in a
savepoint, and share one COMMIT (one fsync). Seen here through SQLite's own
statement trace on the store's connection: fewer COMMITs than writes, every
acknowledged write on disk after a fresh open, and a failed write undone alone.

The trace also slows every COMMIT to what a cloud volume's fsync costs
(``SLOW_COMMIT``): on this machine's fast disk a commit takes ~0.1 ms, and there
the store rightly keeps groups small (a writer waits for company no longer than
a commit costs), so how much grouping happens would depend on how the scheduler
happens to interleave the threads. With a commit that costs, writers always
queue up behind it, and grouping is what the design promises.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.stores import fresh_load, seal_chain
from support.threads import run_together

from chatstate.core.transcript import Conversation
from chatstate.errors import ConflictError
from chatstate.stores import open_store

SLOW_COMMIT = 0.004  # seconds: a network block device's fsync, not this machine's 0.1 ms


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[Any, list[str], str]]:
    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    statements: list[str] = []

    def trace(statement: str) -> None:  # called by SQLite as the statement starts
        statements.append(statement)
        if statement.strip().upper() == "COMMIT":
            time.sleep(SLOW_COMMIT)

    store.db.set_trace_callback(trace)
    try:
        yield store, statements, url
    finally:
        store.db.set_trace_callback(None)
        store.close()


def test_concurrent_writes_share_commits_and_all_land(
        traced: tuple[Any, list[str], str]) -> None:
    store, statements, url = traced
    threads, each = 16, 20
    for i in range(threads):
        store.create(Conversation(id=f"c{i}"))
    del statements[:]

    def work(i: int) -> None:
        for msg in seal_chain(each, prefix=f"t{i}"):
            store.append(f"c{i}", [msg])

    assert run_together(threads, work) == {}
    commits = sum(1 for s in statements if s.strip().upper() == "COMMIT")
    writes = threads * each
    # grouped, not one fsync per write (about 25 here; 320 with no grouping, and ~190 when
    # members woken by their commit raced the next group for the lock)
    assert 0 < commits < writes / 4, (commits, writes)
    for i in range(threads):
        assert [m.content for m in fresh_load(url, f"c{i}").messages] == \
            [f"t{i} {n}" for n in range(each)]


@pytest.mark.invariant(4)
def test_a_failed_write_in_a_group_is_undone_alone(
        traced: tuple[Any, list[str], str]) -> None:
    """Writers whose append conflicts (a seq already taken) fail with ConflictError inside
    a shared transaction; the others' writes in it are committed all the same."""
    store, statements, url = traced
    threads = 12
    for i in range(threads):
        store.create(Conversation(id=f"c{i}"))
        store.append(f"c{i}", seal_chain(2, prefix=f"first{i}"))
    shared_failures = rounds = 0
    for round_ in range(40):  # until a failure has landed inside a shared group
        del statements[:]

        def work(i: int, round_: int = round_) -> None:
            conv = store.load(f"c{i}")
            if i % 3 == 0:  # a stale writer: seq 1 is taken, with other content
                store.append(f"c{i}", seal_chain(1, conv.messages[0], prefix=f"stale{round_}"))
                return
            store.append(f"c{i}", seal_chain(1, conv.messages[-1], prefix=f"r{round_}"))

        errors = list(run_together(threads, work).values())
        rounds += 1
        assert len(errors) == threads // 3, errors  # exactly the stale writers failed
        assert all(isinstance(e, ConflictError) for e in errors), errors
        shared_failures += sum(1 for s in statements if s.startswith("ROLLBACK TO"))
        if shared_failures and round_ >= 3:
            break
    assert shared_failures > 0, "no failed write ever shared a transaction"
    for i in range(threads):
        contents = [m.content for m in fresh_load(url, f"c{i}").messages]
        assert contents[:2] == [f"first{i} 0", f"first{i} 1"]
        if i % 3 == 0:
            assert contents == contents[:2]
        else:  # every round's write, in order
            assert [c.split()[0] for c in contents[2:]] == [f"r{r}" for r in range(rounds)]
