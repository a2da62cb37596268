"""`chatstate migrate`: copy every conversation between any two stores."""

from __future__ import annotations

import json
import os

import click

from chatstate.cli.common import Env, describe_store, fail


@click.command()
@click.option("--from", "src_url", required=True, metavar="URL", help="Source store URL.")
@click.option("--to", "dst_url", required=True, metavar="URL", help="Destination store URL.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Reload every copied conversation and compare it hash by hash.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
def migrate(env: Env, src_url: str, dst_url: str, verify: bool, as_json: bool) -> None:
    """Copy conversations, partial replies and open records from one store to another.

    Idempotent (a rerun skips what is already there and identical) and
    resumable after kill -9. A conversation that differs at the destination is
    reported and never overwritten; it makes the exit code 1.
    """
    from chatstate.ops.migrate import migrate as run_migrate
    from chatstate.stores import open_store, store_class

    source = store_class(src_url.split("://", 1)[0]).from_url(src_url).location()
    if source.path is not None and not os.path.exists(source.path):
        fail(f"the source store {source.path} does not exist: check --from (nothing was "
             "created or copied)")
    src = open_store(src_url, allow_ephemeral=True)  # reading from a throwaway box is the point
    describe_store(src)
    dst = open_store(dst_url, allow_ephemeral=env.allow_ephemeral)
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
