"""The cyclic garbage collector in a ``chatstate serve`` process.

A burst of streams keeps tens of thousands of young objects alive at once (requests,
replies, tasks), hardly any of them in a cycle. With CPython's default thresholds the
collector passed over them every 700 allocations: measured with ``gc.callbacks``, a
200-stream burst spent ~250 ms in collector passes (~160 young passes, ~15 middle ones
and two full ones of ~55 ms each, every pass a stall of the event loop and of every
store call), against ~60 ms with ``steady``. ``steady`` is the serve process's own
setting (the CLI's), not the app's: an app made in another program leaves its
collector alone. The pauses, whatever the setting, are on ``/metrics``
(``CollectorPauses``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

YOUNG_PASS = 50_000
"""Allocations (net of frees) between two young passes in a serve process (CPython: 700)."""


def steady() -> None:
    """What start-up made lives as long as the process: frozen, so no pass walks it
    again; the young pass made rarer (``YOUNG_PASS``), a middle pass every 20 young ones
    and a full one every 20 middle ones (CPython: 10 and 10). Cyclic garbage is still
    collected, in fewer, larger passes."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_PASS, 20, 20)


class CollectorPauses:
    """The collector's passes and the seconds they took, by generation, counted from
    ``gc.callbacks`` between ``start`` and ``stop``; a prometheus collector.

    The callback runs inside a pass, in whichever thread allocated: it only adds to
    plain numbers (a metric's lock taken there could be the one that thread holds)."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._began = 0.0

    def _see(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        generation = info["generation"]
        self.passes[generation] += 1
        self.seconds[generation] += time.perf_counter() - self._began

    def start(self) -> None:
        if self._see not in gc.callbacks:
            gc.callbacks.append(self._see)

    def stop(self) -> None:
        if self._see in gc.callbacks:
            gc.callbacks.remove(self._see)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        passes = CounterMetricFamily("chatstate_serve_gc_passes", "Passes of the cyclic "
                                     "garbage collector", labels=["generation"])
        seconds = CounterMetricFamily("chatstate_serve_gc_seconds", "Seconds the cyclic "
                                      "garbage collector's passes took (each a pause)",
                                      labels=["generation"])
        for generation in range(3):
            passes.add_metric([str(generation)], self.passes[generation])
            seconds.add_metric([str(generation)], self.seconds[generation])
        yield passes
        yield seconds
