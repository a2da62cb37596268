"""SIGKILL a writer at random instants; every acknowledged message must survive exactly once.

One store per kind is reused across all kills. Each round: a warmed-up writer
(``tests/crash_writer.py crash``, imports done, waiting for "go") is released,
appends turns and streams partial replies, printing ``ack <seq> <hash>`` only
after ``append`` returned; it is SIGKILLed after a random delay that spans the
whole write path: its own ``open()`` (recovery of the previous kill), loads,
partial saves, temp-file writes, renames, fsyncs and commits. The next writer
starts importing while this one runs, so interpreter start-up costs no wall time.

After every kill a fresh ``open_store`` (which is recovery) must show: every
acknowledged message present at its seq exactly once, the chain valid, a partial
(if any) for the next seq only, and for json no temp file left anywhere. At the
end, appends still work. ``CHATSTATE_CRASH_KILLS`` raises the count (default 50).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest
from stores import (
    assert_acked_present,
    local_path,
    parse_acks,
    scheme,
    seal_chain,
    spawn_writer,
    temp_files,
)

from chatstate.stores import open_store
from chatstate.transcript import Conversation

KILLS = int(os.environ.get("CHATSTATE_CRASH_KILLS", "50"))
CID = "crashy"

pytestmark = pytest.mark.slow


def _ready(writer: subprocess.Popen[str]) -> None:
    assert writer.stdout is not None
    line = writer.stdout.readline()
    assert line == "ready\n", f"writer did not start: {line!r} {writer.stderr}"


def _go(writer: subprocess.Popen[str]) -> None:
    assert writer.stdin is not None
    writer.stdin.write("go\n")
    writer.stdin.flush()


def _kill_at_random(writer: subprocess.Popen[str], rng: random.Random) -> tuple[str, str]:
    """Let the writer run a random while, SIGKILL it; return its stdout and stderr."""
    assert writer.stdout is not None
    if rng.random() < 0.2:  # early: inside open(), i.e. while it recovers the last kill
        time.sleep(rng.uniform(0, 0.015))
    else:
        # mid-stream: the store is open, appends and partial saves are under way
        if writer.stdout.readline() != "opened\n":
            _out, err = writer.communicate(timeout=5)
            raise AssertionError(f"writer failed before writing: {err}")
        time.sleep(rng.uniform(0, 0.06))
    writer.send_signal(signal.SIGKILL)
    out, err = writer.communicate(timeout=30)
    assert writer.returncode == -signal.SIGKILL, f"writer died on its own: {err}"
    return out, err


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


def test_sigkilled_writer_loses_no_acknowledged_message(store_url: str) -> None:
    rng = random.Random(os.environ.get("CHATSTATE_CRASH_SEED") or None)
    store = open_store(store_url)
    store.create(Conversation(id=CID, title="crash test"))
    store.close()
    acked: list[tuple[int, str]] = []
    recovered: list[str] = []
    writers = [spawn_writer("crash", store_url, CID)]
    _ready(writers[0])
    stored = 0
    try:
        for _ in range(KILLS):
            _go(writers[-1])
            writers.append(spawn_writer("crash", store_url, CID))  # warms up meanwhile
            out, _err = _kill_at_random(writers[-2], rng)
            acked += parse_acks(out)
            stored = _verify(store_url, acked, recovered)
            _ready(writers[-1])
    finally:
        for proc in writers:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    print(f"{len(acked)} acknowledged, {stored} stored; recovery found:", *recovered,
          sep="\n  ")
    assert len(acked) > KILLS, "the writers hardly wrote: the kill points were not spread"
    assert stored >= len(acked)
    store = open_store(store_url)  # and the store still takes appends
    last = store.load(CID).last
    more = seal_chain(2, last)
    store.append(CID, more)
    conv = store.load(CID)
    assert conv.messages[-2:] == more and conv.verify() is None
    assert conv.partial is None
    store.close()
