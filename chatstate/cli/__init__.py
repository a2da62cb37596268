"""The ``chatstate`` command: a thin click shell over the library.

``chatstate`` and ``chatstate --help`` print the pre-rendered top-level help
(``_help.TEXT``, checked against click's own rendering by a test) without
importing click, so asking for help costs little more than starting Python.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

from chatstate import _gcpause

_release: Callable[[], None] = _gcpause.NOT_HELD
"""Turns the cyclic collector on again after this command's start-up (see ``started``)."""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in ([], ["--help"], ["-h"]):
        from chatstate.cli._help import TEXT

        sys.stdout.write(TEXT)
        sys.exit(0)
    _skip_final_collection()
    global _release
    _release = _gcpause.hold()  # until started()
    try:
        from chatstate.cli.app import cli
        from chatstate.cli.common import run

        code = run(cli, argv)
    finally:
        started()
    sys.exit(code)


def started() -> None:
    """The command's start-up is over: the cyclic garbage collector runs again.

    ``main`` starts each command with the collector off: start-up is imports, tens of
    thousands of objects that live until the process ends, and the collector's passes
    over them while they are made find nothing (about 10 ms of CPU in a cold ``chatstate ask``). The
    group's callback calls this once the command's module is imported; the commands that
    open a conversation (``app.OPENS_CHAT``) later, in ``turns.open_chat``, once the
    store, the session and the model adapter are imported and the chat is open. Only
    ``main`` turns it off, so calling this again, or without ``main``, does nothing."""
    global _release
    release, _release = _release, _gcpause.NOT_HELD
    release()


def _skip_final_collection() -> None:
    """Freeze the garbage collector at exit, as the last exit handler to run.

    Everything a command imported lives until the process ends, and CPython's shutdown
    walks all of it for garbage cycles: about 30 ms of CPU after a cold ``chatstate ask``
    (a sixth of the whole process), which frees nothing the OS would not. ``gc.freeze``
    moves those objects out of the collector's sight. It runs after every exit handler
    registered later (atexit calls them last-in, first-out): the writer leases'
    finalizers, the MCP servers' stop, logging's flush; and what is not in a cycle is
    still freed by reference counting as the modules are torn down."""
    import atexit

    atexit.unregister(gc.freeze)  # once, however often main() runs in one process
    atexit.register(gc.freeze)


def __getattr__(name: str) -> object:
    if name == "cli":  # `from chatstate.cli import cli` for tests and embedding
        from chatstate.cli.app import cli

        return cli
    raise AttributeError(name)
