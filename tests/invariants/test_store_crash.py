"""SIGKILL a writer at random instants; every acknowledged message must survive exactly once.

One store per kind is reused across all kills. A warmed-up fork server
(``tests/support/crash_writer.py serve``) forks one writer per round, so neither
interpreter start-up nor imports count against the kill window. Each writer
opens the store (recovering the previous kill), then appends turns and streams
partial replies, printing ``ack <seq> <hash>`` only after ``append`` returned.

Kill points are spread over the whole write path relative to each store's own
speed: one round in five dies at a random instant inside ``open()`` (recovery);
the others wait for 0-4 acknowledgements and then die at a uniformly random
instant within the next write cycle (partial saves, temp-file writes, renames,
fsyncs, commits, conditional PUTs).

After every kill a fresh ``open_store`` (which is recovery) must show: every
acknowledged message present at its seq exactly once, the chain valid, a partial
(if any) for the next seq only, and for json no temp file anywhere. At the end
appends still work. ``CHATSTATE_CRASH_KILLS`` changes the count (default 50),
``CHATSTATE_CRASH_SEED`` replays a run.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import time
from typing import IO

import pytest
from support.stores import (
    assert_acked_present,
    local_path,
    parse_acks,
    scheme,
    seal_chain,
    spawn_writer,
    temp_files,
)

from chatstate.core.transcript import Conversation
from chatstate.stores import open_store

KILLS = int(os.environ.get("CHATSTATE_CRASH_KILLS", "50"))
CID = "crashy"

pytestmark = pytest.mark.slow


class Round:
    """One forked writer: its pid, what it printed, and how long things took."""

    def __init__(self, server: subprocess.Popen[str]) -> None:
        assert server.stdin is not None
        assert server.stdout is not None
        self.out: IO[str] = server.stdout
        self.lines: list[str] = []
        server.stdin.write("go\n")
        server.stdin.flush()
        self.started = time.monotonic()
        first = self.read()
        assert first.startswith("pid "), first
        self.pid = int(first.split()[1])

    def read(self) -> str:
        line = self.out.readline()
        if not line:
            raise AssertionError("the fork server died; its stderr says why")
        self.lines.append(line)
        if line.startswith("done "):
            raise AssertionError(f"the writer exited on its own (status {line.split()[1]})")
        return line

    def until(self, prefix: str) -> float:
        while not self.read().startswith(prefix):
            pass
        return time.monotonic()

    def kill(self) -> list[tuple[int, str]]:
        os.kill(self.pid, signal.SIGKILL)
        while not (line := self.out.readline()).startswith("done "):
            assert line, "the fork server died"
            self.lines.append(line)
        status = int(line.split()[1])
        assert os.WIFSIGNALED(status), \
            f"the writer exited on its own (status {status}): {self.lines[-3:]}"
        assert os.WTERMSIG(status) == signal.SIGKILL, \
            f"the writer exited on its own (status {status}): {self.lines[-3:]}"
        return parse_acks("".join(self.lines))


class Timing:
    """Running estimates of how long open() and one write cycle take in this store."""

    def __init__(self) -> None:
        self.open_s = 0.05
        self.cycle_s = 0.02

    def learn(self, opened: float, cycles: list[float]) -> None:
        self.open_s = 0.7 * self.open_s + 0.3 * opened
        for c in cycles:
            self.cycle_s = 0.7 * self.cycle_s + 0.3 * c


def _run_round(server: subprocess.Popen[str], rng: random.Random,
               timing: Timing) -> list[tuple[int, str]]:
    rnd = Round(server)
    if rng.random() < 0.2:  # inside open(): the writer is recovering the previous kill
        time.sleep(rng.uniform(0, timing.open_s))
        return rnd.kill()
    opened = rnd.until("opened")
    stamps = [opened]
    for _ in range(rng.randint(0, 4)):
        stamps.append(rnd.until("ack "))
    time.sleep(rng.uniform(0, timing.cycle_s))
    acks = rnd.kill()
    timing.learn(opened - rnd.started, [b - a for a, b in itertools.pairwise(stamps)])
    return acks


def _verify(url: str, acked: list[tuple[int, str]], found: list[str]) -> int:
    store = open_store(url)  # a fresh open is recovery
    try:
        found += store.recovery
        if scheme(url) == "json":
            assert temp_files(local_path(url)) == [], store.recovery
        conv = store.load(CID)
        assert conv.verify() is None
        assert_acked_present(conv.messages, acked)
        if conv.partial is not None:
            assert conv.partial.seq == len(conv.messages)
            assert conv.partial.status == "partial"
        return len(conv.messages)
    finally:
        store.close()


@pytest.mark.invariant(4, 7)
def test_sigkilled_writer_loses_no_acknowledged_message(store_url: str) -> None:
    seed = int(os.environ.get("CHATSTATE_CRASH_SEED") or random.randrange(1 << 30))
    rng, timing = random.Random(seed), Timing()
    store = open_store(store_url)
    store.create(Conversation(id=CID, title="crash test"))
    store.close()
    acked: list[tuple[int, str]] = []
    recovered: list[str] = []
    server = spawn_writer("serve", store_url, CID)
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == "ready\n"
        for _ in range(KILLS):
            acked += _run_round(server, rng, timing)
            stored = _verify(store_url, acked, recovered)
    except AssertionError as exc:
        server.kill()
        raise AssertionError(f"{exc}\nseed={seed}\nserver stderr:\n"
                             f"{server.communicate()[1][-3000:]}") from exc
    finally:
        if server.poll() is None and server.stdin is not None:
            server.stdin.close()  # EOF: the fork server exits
            server.wait(30)
    print(f"seed {seed}: {len(acked)} acknowledged, {stored} stored, open {timing.open_s:.3f}s "
          f"cycle {timing.cycle_s:.3f}s; recovery found:", *recovered, sep="\n  ")
    assert len(acked) >= KILLS // 2, "the writers hardly wrote: kill points were not spread"
    assert stored >= len(acked)
    store = open_store(store_url)  # and the store still takes appends
    more = seal_chain(2, store.load(CID).last)
    store.append(CID, more)
    conv = store.load(CID)
    assert conv.messages[-2:] == more
    assert conv.verify() is None
    assert conv.partial is None
    store.close()
