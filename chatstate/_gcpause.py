"""The cyclic garbage collector held off while a burst of long-lived objects is made.

CPython's collector runs a pass every few hundred new container objects and, now and
then, a full one over everything alive. A burst that makes many objects none of which
is in a cycle (a command's start-up imports, the records of a long transcript's load)
pays for passes that find nothing. Two places hold it off: the CLI, from ``main`` until
the command has started (a span that ends in another module, so ``hold`` and its
release), and a store's load (a block, so ``paused``). Either way the collector is
turned on again only by the call that turned it off, and only if it was on then: a
load inside the CLI's start-up leaves it off for the CLI to release.

The lowest layer, beside ``errors``: the stores and the CLI both import it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _nothing() -> None:
    return None


def hold() -> Callable[[], None]:
    """Turn the collector off; return the release that turns it on again.

    The release does so once, and only if the collector was on when ``hold`` ran;
    calling it again does nothing."""
    if not gc.isenabled():
        return _nothing
    gc.disable()
    held = [True]

    def release() -> None:
        if held:
            held.clear()
            gc.enable()

    return release


NOT_HELD: Callable[[], None] = _nothing
"""A release for a span that was never held: does nothing."""


@contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block (``hold`` and its release around it)."""
    release = hold()
    try:
        yield
    finally:
        release()
