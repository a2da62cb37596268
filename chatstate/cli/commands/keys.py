"""`chatstate keygen`: print a new encryption key (see docs/encryption.md)."""

from __future__ import annotations

import sys

import click


@click.command()
def keygen() -> None:
    """Print a new random encryption key on stdout.

    Keep it outside the store: in a password manager (CHATSTATE_KEY_COMMAND), a file
    only you can read (CHATSTATE_KEY_FILE, mode 0600) or CHATSTATE_ENCRYPTION_KEY.
    A store created with a key is readable only with it: a lost key is lost data.
    """
    from chatstate.stores.codec import new_key

    click.echo(new_key())
    if sys.stdout.isatty():
        click.echo("store it now (e.g. `chatstate keygen > key && chmod 600 key`); chatstate "
                   "keeps no copy", err=True)
