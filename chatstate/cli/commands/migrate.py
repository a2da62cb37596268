"""`chatstate migrate`: copy every conversation between any two stores."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Literal

import click

from chatstate.cli.common import Env, describe_store, fail


@click.command()
@click.option("--from", "src_url", required=True, metavar="URL", help="Source store URL.")
@click.option("--to", "dst_url", required=True, metavar="URL", help="Destination store URL.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Reload every copied conversation and compare it hash by hash.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--encrypt", "direction", flag_value="encrypt", default=None,
              help="Read a plain source; write the destination encrypted with the configured "
              "key.")
@click.option("--decrypt", "direction", flag_value="decrypt",
              help="Read the source with the configured key; write a plain destination.")
@click.pass_obj
def migrate(env: Env, src_url: str, dst_url: str, verify: bool, as_json: bool,
            direction: str | None) -> None:
    """Copy conversations, partial replies and open records from one store to another.

    Idempotent (a rerun skips what is already there and identical) and
    resumable after kill -9. A conversation that differs at the destination is
    reported and never overwritten; it makes the exit code 1. Without --encrypt or
    --decrypt both stores open with the configured key (or both without one).
    """
    copy(env, src_url, dst_url, verify=verify, as_json=as_json,
         src_key=None if direction == "encrypt" else "env",
         dst_key=None if direction == "decrypt" else "env")


def copy(env: Env, src_url: str, dst_url: str, *, verify: bool, as_json: bool,
         src_key: bytes | Literal["env"] | None, dst_key: bytes | Literal["env"] | None,
         old_keys: Sequence[bytes] = ()) -> None:
    """``migrate`` (and ``rekey``): open both stores with their keys, copy, report."""
    from chatstate.ops.migrate import migrate as run_migrate
    from chatstate.stores import open_store, store_class

    source = store_class(src_url.split("://", 1)[0]).from_url(src_url).location()
    if source.path is not None and not os.path.exists(source.path):
        fail(f"the source store {source.path} does not exist: check --from (nothing was "
             "created or copied)")
    # reading from a throwaway box is the point
    src = open_store(src_url, allow_ephemeral=True, key=src_key, old_keys=old_keys)
    describe_store(src)
    dst = open_store(dst_url, allow_ephemeral=env.allow_ephemeral, key=dst_key)
    describe_store(dst)
    try:
        report = run_migrate(src, dst, verify=verify,
                             progress=None if as_json else lambda line: click.echo(line, err=True))
    finally:
        src.close()
        dst.close()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        blobs = f", {report.blobs_copied} blob(s)" if report.blobs_copied else ""
        click.echo(f"copied {len(report.copied)} conversation(s) ({report.messages_copied} "
                   f"messages, {report.partials_copied} partial replies, {report.opens_copied} "
                   f"open records{blobs}); {len(report.skipped)} already identical; "
                   f"{len(report.conflicts)} conflict(s); {len(report.failed)} failed")
    if not report.ok:
        raise click.exceptions.Exit(1)


@click.command()
@click.option("--from", "src_url", required=True, metavar="URL",
              help="The store encrypted with the old key (CHATSTATE_OLD_ENCRYPTION_KEY, "
              "CHATSTATE_OLD_KEY_FILE or CHATSTATE_OLD_KEY_COMMAND).")
@click.option("--to", "dst_url", required=True, metavar="URL",
              help="A new store, encrypted with the configured (new) key.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def rekey(env: Env, src_url: str, dst_url: str, as_json: bool) -> None:
    """Re-encrypt every conversation under a new key, into a new store.

    The old key only reads the source, which is never changed; the new key writes
    the destination. Kill it at any point and run it again: it resumes where it
    stopped (it is a verified migrate). Point CHATSTATE_STORE at the new store once it
    reports no conflicts, then retire the old key.
    """
    from chatstate.errors import ConfigurationError
    from chatstate.stores.keys import load_key

    old = load_key(old=True)
    if old is None:
        raise ConfigurationError("rekey needs the old key, to read --from: set "
                                 "CHATSTATE_OLD_ENCRYPTION_KEY, CHATSTATE_OLD_KEY_FILE or "
                                 "CHATSTATE_OLD_KEY_COMMAND")
    if load_key() is None:
        raise ConfigurationError("rekey needs the new key, to write --to: set "
                                 "CHATSTATE_ENCRYPTION_KEY, CHATSTATE_KEY_FILE or "
                                 "CHATSTATE_KEY_COMMAND (`chatstate keygen` makes one)")
    copy(env, src_url, dst_url, verify=True, as_json=as_json, src_key=old, dst_key="env")
