"""Several processes chatting at once, through ``Chat``, against one store.

Four worker processes (``tests/support/fault_writer.py chat``; two stream, two do not)
each load the conversation, are then released together on a "go" line, and each
completes three turns against the fake
model in this process. Chat cannot tell a live writer's unfinished turn from a
dead one's (a new turn goes on after it), so each worker behaves as a careful
caller on a shared conversation must: it waits while another writer's turn is
open, and after a ConflictError (it lost the race to append) it backs off and
reloads. On one conversation they must contend; on four they must not. Either
way: the chain verifies, every turn a worker saw complete is stored exactly
once (user message and reply at the seqs it was told), the transcript is whole
turns only (no user message without its reply, no reply away from its own
user message: no interleaved half-turns), and every loser got a ConflictError
that names the store or the conversation and had written nothing.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from support.faultlib import PYTHON, WRITER, turn_problems
from support.stores import local_path

from chatstate import open_store
from chatstate.core.transcript import Conversation, Message
from chatstate.testing import FakeModel

WORKERS = 4
TURNS = 3
LATENCY = 0.25

pytestmark = pytest.mark.slow


def run_workers(url: str, cids: list[str], base_url: str) -> list[list[dict[str, Any]]]:
    """Start one worker per cid, release them together, return each one's reports."""
    procs = [subprocess.Popen([PYTHON, str(WRITER), "chat", url, cid, base_url, str(TURNS),
                               *(["--stream"] if i % 2 else [])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i, cid in enumerate(cids)]
    for expect in ("ready\n", "loaded\n"):  # every worker loads before any of them writes
        for proc in procs:
            assert proc.stdout is not None, proc.communicate()[1]
            assert proc.stdout.readline() == expect, proc.communicate()[1]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        reports.append([json.loads(line) for line in out.splitlines()])
    return reports


def load(url: str, cid: str) -> list[Message]:
    store = open_store(url)
    try:
        conv: Conversation = store.load(cid)
        assert conv.verify() is None, f"{cid}: chain broken at {conv.verify()}"
        return conv.messages
    finally:
        store.close()


def check_turns(messages: list[Message], reports: list[dict[str, Any]]) -> None:
    """Every turn a worker completed is stored once, where it was told."""
    hashes = [m.hash for m in messages]
    done = [r for r in reports if "turn" in r]
    for turn in done:
        for seq, digest in (turn["user"], turn["reply"]):
            assert hashes.count(digest) == 1, turn
            assert hashes[seq] == digest, turn
        assert messages[turn["reply"][0]].turn_id == turn["turn"]
    assert turn_problems(messages) == []
    pairs = [(m.role, m.status) for m in messages]
    assert pairs == [("user", "complete"), ("assistant", "complete")] * len(done), \
        "a half-turn was left in the transcript"
    assert {m.turn_id for m in messages} == {t["turn"] for t in done}


@pytest.fixture
def fake() -> Any:
    # a turn takes at least LATENCY: a loser of the first append reloads long before the
    # winner's turn completes, even on a loaded machine, so it sees the turn half done
    with FakeModel(latency=LATENCY, chunk_delay=0.002, reply_words=6) as server:
        yield server


@pytest.mark.invariant(5)
def test_writers_on_one_conversation(local_store_url: str, fake: FakeModel) -> None:
    reports = run_workers(local_store_url, ["shared"] * WORKERS, fake.base_url)
    messages = load(local_store_url, "shared")
    every = [r for worker in reports for r in worker]
    check_turns(messages, every)
    assert sum(1 for r in every if "turn" in r) == WORKERS * TURNS
    conflicts = [r["conflict"] for r in every if "conflict" in r]
    where = (str(local_path(local_store_url)), "conversation 'shared'")
    assert all(any(w in c for w in where) for c in conflicts), conflicts[:3]
    # all four loaded the same (empty) conversation before any wrote: one won the first
    # append, and each of the other three lost the race to it, saw its turn half done,
    # and got a ConflictError (writing nothing)
    assert len(conflicts) >= WORKERS - 1, f"the writers did not race: {conflicts}"


@pytest.mark.invariant(5)
def test_writers_on_separate_conversations(local_store_url: str, fake: FakeModel) -> None:
    cids = [f"own-{i}" for i in range(WORKERS)]
    reports = run_workers(local_store_url, cids, fake.base_url)
    for cid, worker in zip(cids, reports, strict=True):
        assert not [r for r in worker if "conflict" in r], f"{cid} collided with nobody"
        messages = load(local_store_url, cid)
        check_turns(messages, worker)
        assert len(messages) == 2 * TURNS
    store = open_store(local_store_url)
    try:
        assert sorted(s.id for s in store.list_conversations()) == cids
    finally:
        store.close()
