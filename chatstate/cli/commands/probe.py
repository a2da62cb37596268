"""``chatstate probe`` and ``chatstate probe diff``: where writes land, and what survived."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from chatstate.cli.common import Env


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (save it for "
              "`probe diff`).")
@click.option("--path", "paths", multiple=True, metavar="DIR",
              help="Also probe this directory (repeatable).")
@click.pass_context
def probe(ctx: click.Context, as_json: bool, paths: tuple[str, ...]) -> None:
    """Boot id, hostname, cwd, DEPLOY_ID, and where writes land.

    For /tmp, $HOME, the current directory, the store's directory (from the
    store URL; the store is not opened) and each --path: exists, writable,
    device, filesystem and durability verdict; for the store's directory and
    each --path also a SQLite row count.

    What it writes, only in the store's directory and each --path that exists:
    one row per run in a small SQLite file .chatstate-probe.db (kept, so that
    the next run can count the rows earlier runs left: run it again after a
    reboot or a redeploy and compare with `chatstate probe diff`), and a
    write+fsync+read probe file that is deleted at once. /tmp, $HOME and the
    current directory are only inspected unless named with --path. It creates
    no directory. The probe files may be deleted at any time.
    """
    if ctx.invoked_subcommand is not None:
        return
    from chatstate.ops.probe import run

    env: Env = ctx.obj
    report = run(paths, env.store_url)
    click.echo(json.dumps(report, indent=2, sort_keys=True) if as_json else _text(report))


@probe.command("diff")
@click.argument("first", metavar="A.json")
@click.argument("second", metavar="B.json")
def diff_cmd(first: str, second: str) -> None:
    """Explain two `probe --json` runs in words: rebooted or not, which paths lost rows."""
    from chatstate.ops.probe import ProbeReportError, diff, load_report

    try:
        a, b = load_report(first), load_report(second)
    except ProbeReportError as exc:
        click.echo(f"error: {exc}", err=True)
        # SystemExit keeps its code through click and common.run() in any mode
        sys.exit(2)
    click.echo(f"A: {first} ({a.get('time') or '?'} on {a.get('hostname') or '?'})")
    click.echo(f"B: {second} ({b.get('time') or '?'} on {b.get('hostname') or '?'})")
    for line in diff(a, b):
        click.echo(f"- {line}")


def _text(report: dict[str, Any]) -> str:
    head = [("time", report["time"]), ("boot id", report["boot_id"] or "(unknown)"),
            ("hostname", report["hostname"]), ("cwd", report["cwd"]),
            ("DEPLOY_ID", report["deploy_id"] or "(unset)"), ("store", report["store"])]
    lines = [f"{k:<10} {v}" for k, v in head]
    if report.get("store_note"):
        lines.append(f"{'':<10} ({report['store_note']})")
    for entry in report["paths"]:
        lines += ["", f"{entry['path']}  [{', '.join(entry['labels'])}]"]
        state = ("exists" if entry["exists"] else "does not exist") + (
            ", writable" if entry["writable"] else ", NOT writable" if entry["exists"] else "")
        lines.append(f"  {state}; device {entry['device'] or '?'}, {entry['fstype'] or '?'} "
                     f"{entry['source'] or '?'} at {entry['mount_point'] or '?'}")
        lines.append(f"  verdict: {entry['verdict']}")
        lines += [f"    - {reason}" for reason in entry["reasons"]]
        lines.append("  sqlite probe: " + _rows(entry["sqlite"]))
    return "\n".join(lines)


def _rows(sq: dict[str, Any]) -> str:
    if sq.get("error"):
        return str(sq["error"])
    if not sq["rows_before"]:
        new = " (new file)" if not sq.get("existed") else ""
        return f"0 rows before this run{new}, 1 now: {sq['file']}"
    boots, rows = sq["boots_before"], sq["rows_before"]
    return (f"{rows} row{'s' * (rows != 1)} before this run (from {boots} boot"
            f"{'s' * (boots != 1)}, first {sq['first_row_at']}), {sq['rows_after']} now: "
            f"{sq['file']}")
