"""Hold Ctrl-C back while a write is between BEGIN and COMMIT.

Python raises KeyboardInterrupt at the next bytecode boundary after SIGINT, which
may fall between a ``BEGIN`` that returned and the ``try`` that guards it, or
inside a context manager's ``__enter__``: the transaction is then left open on a
connection the process goes on using, and every later write fails ("cannot start
a transaction within a transaction"). Inside ``uninterruptible()`` the signal is
recorded instead, and handed to the previous handler once the block has ended,
so a write is whole or absent. The same idea as Mercurial's ``uninterruptible``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["uninterruptible"]


class _Deferred:
    """The SIGINT handler in force inside the block: it only remembers the signal."""

    def __init__(self) -> None:
        self.caught: tuple[int, FrameType | None] | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.caught = (signum, frame)


@contextmanager
def uninterruptible() -> Iterator[None]:
    """SIGINT that arrives inside the block takes effect when the block ends.

    Only the main thread runs Python signal handlers, so elsewhere (and when
    nested) this does nothing; a handler set from C (``getsignal`` gives None)
    is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or isinstance(previous, _Deferred):
        yield
        return
    deferred = _Deferred()
    signal.signal(signal.SIGINT, deferred)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if deferred.caught is not None:
            _deliver(previous, *deferred.caught)


def _deliver(handler: Any, signum: int, frame: FrameType | None) -> None:
    if handler is signal.SIG_IGN:
        return
    if handler is signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action, now that the write is done
        return
    handler(signum, frame)
