"""``chatstate survival write|verify``: checksummed records that must outlive restarts."""

from __future__ import annotations

import sys

import click


@click.group()
def survival() -> None:
    """Write/verify checksummed records across restarts.

    Write a record before a reboot, a redeploy or a kill -9, then verify after:
    a record that `write` reported is either there intact or verify says which
    line is wrong. Records go to DIR/survival.jsonl, one JSON line each with a
    sha256, fsync'd with their directory before `write` returns.
    """


@survival.command("write")
@click.option("--dir", "directory", required=True, metavar="DIR",
              help="Directory of survival.jsonl (created if missing).")
@click.option("--note", default=None, help="A note stored in the record.")
def write_cmd(directory: str, note: str | None) -> None:
    """Append one checksummed record (seq, time, boot id, hostname, note, sha256)."""
    from chatstate.durable.guard import inspect
    from chatstate.ops.survival import FILE_NAME, write

    where = inspect(directory, probe=False)
    click.echo(f"{directory} {where.one_line()}", err=True)
    record = write(directory, note)
    click.echo(f"wrote seq {record['seq']} to {directory.rstrip('/')}/{FILE_NAME} (boot "
               f"{record['boot_id'] or '?'}, host {record['hostname']}); fsync'd")


@survival.command("verify")
@click.option("--dir", "directory", required=True, metavar="DIR",
              help="Directory of survival.jsonl.")
def verify_cmd(directory: str) -> None:
    """Check every record's sha256 and that seqs are contiguous.

    Exit 0 when all records check out, 1 on any mismatch (each bad line named),
    2 when the file is missing.
    """
    from chatstate.ops.survival import SurvivalFileMissing, verify

    try:
        result = verify(directory)
    except SurvivalFileMissing as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)  # SystemExit keeps its code in any click mode
    for problem in result.problems:
        click.echo(f"MISMATCH {problem}")
    problems = len(result.problems)
    click.echo(f"ok: {result.summary()}" if result.ok else
               f"FAILED: {problems} problem{'s' * (problems != 1)}; intact: {result.summary()}")
    if not result.ok:
        sys.exit(1)
