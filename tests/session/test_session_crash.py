"""SIGKILL a streaming chat at random moments: what it showed is always stored.

``tests/support/stream_child.py`` imports chatstate once and forks a fresh writer
process per turn; each writer opens the store, streams a reply from the fake
model (running here, in the test process) and prints every delta as Chat
yields it. The test SIGKILLs the writer at a random moment after telling it to
start (scaled to how long a turn takes on this machine), so kills land while
opening and recovering, appending the user message, settling a partial,
streaming, committing, and after the turn is done.

After every kill, two fresh opens (one in this process right away, one in the
next writer before it writes anything) must show, for the killed writer's
turn, a stored reply (partial or complete) that starts with everything it
printed; the chain verifies, and no message stored earlier has gone.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import SUPPORT
from support.stores import fresh_load
from support.stream_child import latest_replies

from chatstate import Conversation
from chatstate.testing import FakeModel

CHILD = SUPPORT / "stream_child.py"
KILLS = 50
# Kills land uniformly in [0, WINDOW x the typical time from "go" to the end of the
# reply], so about a quarter come after the turn and the rest spread over it.
WINDOW = 1.3
CID = "crash-stream"

pytestmark = pytest.mark.slow


class ForkServer:
    """The stream_child process: one JSON object per stdout line, read by a thread."""

    def __init__(self, url: str, base_url: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATSTATE_", "OPENAI_"))}
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), url, base_url], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[Any] = queue.Queue()
        self.early: list[dict[str, Any]] = []
        self.go_time = self.last_time = time.monotonic()
        self.turn_time = 0.3  # seconds from "go" to the end of the reply, last seen
        threading.Thread(target=self._pump, daemon=True).start()
        assert self.next(timeout=60) == "ready"

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), json.loads(line)))
        self.lines.put(EOFError)

    def next(self, timeout: float = 30) -> Any:
        try:
            item = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"stream_child said nothing for {timeout}s") from None
        if item is EOFError:
            raise AssertionError(f"stream_child exited: {self.stderr()}")
        self.last_time = item[0]
        return item[1]

    def stderr(self) -> str:
        self.proc.kill()
        _, err = self.proc.communicate(timeout=10)
        return err

    def go(self, mode: str) -> int:
        assert self.proc.stdin is not None
        self.go_time = time.monotonic()
        self.proc.stdin.write(f"go {CID} {mode}\n")
        self.proc.stdin.flush()
        while "pid" not in (item := self.next()):
            self.early.append(item)  # the forked writer may speak before its parent does
        return int(item["pid"])

    def until_reaped(self, pid: int) -> list[dict[str, Any]]:
        out, self.early = self.early, []
        while True:
            item = self.next()
            if item.get("reaped") == pid:
                return out
            if item.get("end"):
                self.turn_time = self.last_time - self.go_time
            out.append(item)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Killed:
    """What one killed writer printed."""

    def __init__(self, lines: list[dict[str, Any]]) -> None:
        errors = [line["error"] for line in lines if "error" in line]
        assert not errors, f"the writer failed before it was killed: {errors}"
        self.found = next((line["found"] for line in lines if "found" in line), None)
        self.turn = next((line["turn"] for line in lines if "turn" in line), None)
        self.printed = "".join(line["d"] for line in lines if "d" in line)
        self.ended = any(line.get("end") for line in lines)

    @property
    def phase(self) -> str:
        if self.ended:
            return "after the reply"
        return "mid-stream" if self.printed else "before the first delta"


def check_stored(conv: Conversation, turn: str | None, printed: str, ended: bool,
                 before: list[str]) -> None:
    assert conv.verify() is None
    hashes = [m.hash for m in conv.messages]
    assert hashes[:len(before)] == before, "a message stored before the kill has gone"
    if not printed:
        return
    assert turn is not None
    stored = latest_replies(conv).get(turn, "")
    assert stored.startswith(printed), (
        f"turn {turn}: the writer printed {len(printed)} chars that the store does not hold "
        f"(stored {len(stored)}: {stored!r}, printed {printed!r})")
    if ended:
        reply = [m for m in conv.messages if m.turn_id == turn and m.role == "assistant"][-1]
        assert (reply.status, reply.content) == ("complete", printed)


def check_transcript_shape(conv: Conversation) -> None:
    """One user message per turn, replies after it, at most one complete reply per turn."""
    users = Counter(m.turn_id for m in conv.messages if m.role == "user")
    assert all(n == 1 for n in users.values()), users
    complete = Counter(m.turn_id for m in conv.messages
                       if m.role == "assistant" and m.status == "complete")
    assert all(n == 1 for n in complete.values()), complete
    seen: set[str] = set()
    for m in conv.messages:
        if m.role == "user":
            seen.add(m.turn_id)
        elif m.role == "assistant":
            assert m.turn_id in seen, f"reply seq {m.seq} precedes its user message"


@pytest.mark.invariant(2)
@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_sigkill_mid_stream_never_loses_what_was_shown(kind: str, tmp_path: Path) -> None:
    url = f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    rng = random.Random()
    phases: Counter[str] = Counter()
    with FakeModel(chunk_delay=0.002, reply_words=50) as fake:
        server = ForkServer(url, fake.base_url)
        try:
            unchecked: list[Killed] = []  # killed writers not yet seen by a fresh process
            before: list[str] = []
            mode, typical = "new", 0.3
            for _ in range(KILLS):
                pid = server.go(mode)
                time.sleep(rng.uniform(0, WINDOW * typical))
                os.kill(pid, signal.SIGKILL)
                killed = Killed(server.until_reaped(pid))
                phases[killed.phase] += 1
                if killed.found is not None:  # a fresh process's view of the kills before
                    assert killed.found["verify"] is None
                    for earlier in unchecked:
                        if earlier.printed:
                            stored = killed.found["replies"].get(earlier.turn, "")
                            assert stored.startswith(earlier.printed)
                    unchecked = []
                unchecked.append(killed)
                conv = fresh_load(url, CID)
                check_stored(conv, killed.turn, killed.printed, killed.ended, before)
                check_transcript_shape(conv)
                before = [m.hash for m in conv.messages]
                mode = "retry" if rng.random() < 0.7 else "new"
                typical = 0.8 * typical + 0.2 * server.turn_time

            # One last writer, left to finish: the conversation survived 50 kills intact.
            pid = server.go("retry")
            lines: list[dict[str, Any]] = []
            while not any(line.get("end") or "error" in line for line in lines):
                lines.append(server.next())
            os.kill(pid, signal.SIGKILL)
            lines += server.until_reaped(pid)
            last = Killed(lines)
            assert last.found is not None
            assert last.found["verify"] is None
            for earlier in unchecked:
                if earlier.printed:
                    assert last.found["replies"].get(earlier.turn, "").startswith(earlier.printed)
            conv = fresh_load(url, CID)
            check_stored(conv, last.turn, last.printed, True, before)
            check_transcript_shape(conv)
            assert conv.partial is None
            assert conv.messages[-1].status == "complete"
        finally:
            server.close()
    print(f"{kind}: kill points {dict(phases)}")
    # The kills must really have spread over the turn, not all landed before it.
    assert phases["mid-stream"] >= 5, phases
    assert sum(phases.values()) == KILLS
