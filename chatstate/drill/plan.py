"""When to pull the trigger, and what the writer was doing when it died.

Each trial aims at one phase, in a seeded, balanced order: *before the call*
(between turns, or just after the user message is acknowledged and before the
request), *mid-stream* (the request is in flight: waiting for the first byte, or
between two chunks) or
*inside a store write* (right after the writer said it is entering one, after
a random 0-800 µs: inside the temp-file write, the fsync, the rename, the
COMMIT, the conditional PUT). Which turn and which write is drawn at random.

The kill lands where it lands: what is counted is the phase the writer had
reported last before it died (``PhaseTracker``), not the one aimed at.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from chatstate.drill._common import PHASES

WRITE_DELAY = 0.0008
"""Longest wait after "entering a store write" before SIGKILL."""
MID_STREAM_DELAY = 0.0003
"""Longest wait after a rendered delta: between two chunks, before the next partial save."""


@dataclass(frozen=True)
class KillPlan:
    """Kill after the ``nth`` event matching ``trigger``, ``delay`` seconds later."""

    aim: str
    trigger: str  # an event kind, or "user-ack", or "open"
    nth: int
    delay: float

    def matches(self, event: list[Any]) -> bool:
        kind = event[0]
        if self.trigger == "open":
            return bool(kind == "w" and event[1] == "open")
        if self.trigger == "user-ack":
            return kind == "a" and any(ack[3] == "user" for ack in event[3])
        if self.trigger == "w":
            return bool(kind == "w" and event[1] != "open")
        return bool(kind == self.trigger)


def plans(rng: random.Random, latency: float, think: float) -> Any:
    """An endless, seeded sequence of plans cycling through the three phases.

    ``latency`` is the fake model's time to first byte, ``think`` the least time a
    writer pauses before a turn: the windows aimed into.
    """
    order = list(PHASES)
    rng.shuffle(order)
    while True:
        for aim in order:
            yield _plan(rng, aim, latency, think)


def _plan(rng: random.Random, aim: str, latency: float, think: float) -> KillPlan:
    if aim == "before_call":
        if rng.random() < 0.6:
            return KillPlan(aim, "b", rng.randint(1, 3), rng.uniform(0, think))
        return KillPlan(aim, "user-ack", rng.randint(1, 3), 0.0)  # user stored, no request
    if aim == "mid_stream":
        if rng.random() < 0.6:  # waiting for the model's first byte
            return KillPlan(aim, "call", rng.randint(1, 3), rng.uniform(0, latency))
        return KillPlan(aim, "d", rng.randint(1, 14), rng.uniform(0, MID_STREAM_DELAY))
    if rng.random() < 0.1:
        return KillPlan(aim, "open", 1, rng.uniform(0, WRITE_DELAY))
    return KillPlan(aim, "w", rng.randint(1, 16), rng.uniform(0, WRITE_DELAY))


def spin(seconds: float) -> None:
    """Wait ``seconds`` precisely (sleep() overshoots sub-millisecond waits)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class PhaseTracker:
    """The writer's phase, from the events it reported, in order."""

    def __init__(self) -> None:
        self.phase = "before_call"
        self.op = ""
        self._outside = "before_call"

    def apply(self, event: list[Any]) -> None:
        kind = event[0]
        if kind == "w":
            if self.phase != "in_store_write":
                self._outside = self.phase
            self.phase, self.op = "in_store_write", str(event[1])
        elif kind == "a":
            self.phase, self.op = self._outside, ""
        elif kind in ("b", "e"):
            self.phase = self._outside = "before_call"
        elif kind == "call":
            self.phase = self._outside = "mid_stream"
