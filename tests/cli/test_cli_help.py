"""The fast top-level help is click's own rendering, not a hand-kept copy."""

from __future__ import annotations

import subprocess
import sys

from chatstate.cli._help import TEXT
from chatstate.cli.app import render_help


def test_prerendered_help_matches_click() -> None:
    assert render_help() == TEXT, "run scripts/gen-help to regenerate chatstate/cli/_help.py"


def test_help_does_not_import_click() -> None:
    code = ("import sys; from chatstate.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('click' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout == TEXT
    assert out.stderr.strip() == "False"


def test_every_listed_command_loads() -> None:
    import click

    from chatstate.cli.app import COMMANDS, cli

    with click.Context(cli) as ctx:
        for name in COMMANDS:
            command = cli.get_command(ctx, name)
            assert command is not None
            assert "not built yet" not in (command.help or ""), name
