"""The ``chatstate`` command: a thin click shell over the library.

``chatstate`` and ``chatstate --help`` print the pre-rendered top-level help
(``_help.TEXT``, checked against click's own rendering by a test) without
importing click, so asking for help costs little more than starting Python.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in ([], ["--help"], ["-h"]):
        from chatstate.cli._help import TEXT

        sys.stdout.write(TEXT)
        sys.exit(0)
    from chatstate.cli.app import cli
    from chatstate.cli.common import run

    sys.exit(run(cli, argv))


def __getattr__(name: str) -> object:
    if name == "cli":  # `from chatstate.cli import cli` for tests and embedding
        from chatstate.cli.app import cli

        return cli
    raise AttributeError(name)
