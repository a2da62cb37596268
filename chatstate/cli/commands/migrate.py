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
@click.option("--new-key-file", metavar="PATH", help="A file holding the new key (mode 0600, "
              "like CHATSTATE_KEY_FILE).")
@click.option("--new-key-env", metavar="NAME", help="The name of an environment variable "
              "holding the new key.")
@click.option("--new-key-command", metavar="COMMAND", help="A command that prints the new key "
              "(run without a shell, like CHATSTATE_KEY_COMMAND).")
@click.option("--wait", type=click.FloatRange(0), default=120.0, show_default=True,
              help="Seconds to wait for a turn in progress (it holds its conversation's "
              "writer lease) before stopping, to be run again later.")
@click.option("--from", "src_url", metavar="URL",
              help="Copy form: the store encrypted with the old key (CHATSTATE_OLD_ENCRYPTION_KEY, "
              "CHATSTATE_OLD_KEY_FILE or CHATSTATE_OLD_KEY_COMMAND), never changed.")
@click.option("--to", "dst_url", metavar="URL",
              help="Copy form: a new store, encrypted with the configured (new) key.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def rekey(env: Env, new_key_file: str | None, new_key_env: str | None,
          new_key_command: str | None, wait: float, src_url: str | None,
          dst_url: str | None, as_json: bool) -> None:
    """Re-encrypt the store under a new key, in place.

    The old key is the configured one (CHATSTATE_ENCRYPTION_KEY, CHATSTATE_KEY_FILE
    or CHATSTATE_KEY_COMMAND); the new one comes from --new-key-file, --new-key-env
    or --new-key-command. From the moment it starts, the store opens with either key
    and every append is sealed under the new one; kill it at any point and run it
    again: it resumes. When it finishes no record is sealed by the old key and the
    old key is refused: configure the new one.

    With --from and --to instead, it copies the --from store (old key) into a new
    store (the configured key), a verified migrate that never changes the source.
    """
    from chatstate.errors import ConfigurationError
    from chatstate.stores.keys import load_key, load_new_key

    if src_url or dst_url:
        if not (src_url and dst_url):
            raise click.UsageError("rekey: the copy form needs both --from and --to")
        if new_key_file or new_key_env or new_key_command:
            raise click.UsageError("rekey: --from/--to take the new key from the usual settings "
                             "and the old one from CHATSTATE_OLD_*; --new-key-* is for the "
                             "in-place form")
        _rekey_copy(env, src_url, dst_url, as_json)
        return
    if sum(bool(x) for x in (new_key_file, new_key_env, new_key_command)) != 1:
        raise click.UsageError("rekey: name the new key with one of --new-key-file, --new-key-env "
                         "or --new-key-command (`chatstate keygen` makes one)")
    new = load_new_key(file=new_key_file, env_var=new_key_env, command=new_key_command)
    old = load_key()
    if old is None or new is None:
        raise ConfigurationError("rekey needs the store's current key: set "
                                 "CHATSTATE_ENCRYPTION_KEY, CHATSTATE_KEY_FILE or "
                                 "CHATSTATE_KEY_COMMAND")
    from chatstate.stores import open_store
    from chatstate.stores.rekey import rekey_in_place

    store = open_store(env.store_url, allow_ephemeral=env.allow_ephemeral, keyless=True,
                       key=None)
    describe_store(store)
    try:
        report = rekey_in_place(store, old, new, lease_wait=wait, progress=None if as_json
                                else lambda line: click.echo(line, err=True))
    finally:
        store.close()
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    elif report.already_done:
        click.echo(f"the store is encrypted by key {report.new} already; nothing to do")
    else:
        blobs = (f" and {report.blobs} blob(s) (stored again at their new addresses; the "
                 "old copies are named by nothing now: `chatstate gc` removes them)"
                 ) if report.blobs else ""
        click.echo(f"re-encrypted {report.records} record(s) in "
                   f"{len(report.conversations)} conversation(s){blobs} under key "
                   f"{report.new}; key {report.old} is now refused: configure the new key")


def _rekey_copy(env: Env, src_url: str, dst_url: str, as_json: bool) -> None:
    """``rekey --from --to``: every conversation re-encrypted into a new store."""
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
