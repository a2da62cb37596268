"""Show that a turn is waiting for the model: a spinner with the seconds, on stderr.

A frozen server can be silent for minutes (each attempt waits the read
timeout, and failed attempts are retried). On a terminal the user sees that
chatstate is waiting and for how long; the spinner goes away with the first
text of the reply. Off a terminal nothing is printed. rich loads only when a
spinner is actually shown.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TypeVar

T = TypeVar("T")

LABEL = "waiting for the model"
AFTER = 1.5  # seconds of silence before the spinner shows: a quick reply needs none


class Spinner:
    """A transient rich status line on stderr, relabelled with the elapsed seconds."""

    def __init__(self, label: str = LABEL) -> None:
        self._label = label
        self._status: Any = None
        self._done = threading.Event()
        self._ticker: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        started = time.monotonic()

        def tick() -> None:
            if self._done.wait(AFTER):
                return
            from rich.console import Console

            with self._lock:
                if self._done.is_set():
                    return
                self._status = Console(stderr=True).status(self._text(started))
                self._status.start()
            while not self._done.wait(1.0):
                self._status.update(self._text(started))

        self._ticker = threading.Thread(target=tick, name="chatstate-spinner", daemon=True)
        self._ticker.start()

    def _text(self, started: float) -> str:
        return f"{self._label}… {time.monotonic() - started:.0f}s (Ctrl-C stops)"

    def stop(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._done.set()
            status = self._status
        if self._ticker is not None:
            self._ticker.join()
        if status is not None:
            status.stop()


def enabled() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def waiting(show: bool) -> Iterator[Spinner | None]:
    """A spinner for the length of the block (when ``show``)."""
    spinner = Spinner() if show else None
    if spinner is not None:
        spinner.start()
    try:
        yield spinner
    finally:
        if spinner is not None:
            spinner.stop()


def until_first(items: Iterator[T], show: bool) -> Iterator[T]:
    """``items``, with a spinner (when ``show``) until the first one arrives."""
    with waiting(show) as spinner:
        for item in items:
            if spinner is not None:
                spinner.stop()
            yield item
