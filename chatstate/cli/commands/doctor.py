"""``chatstate doctor``: readiness that touches real state, and where chatstate keeps what."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from chatstate.cli.common import Env
    from chatstate.ops.doctor import DoctorReport


@click.command()
@click.option("--store-only", is_flag=True, help="Check the store only, not the model "
              "endpoint (GET BASE_URL/models).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--limit", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Load and verify at most this many conversations, newest first.")
@click.option("--serve-url", metavar="URL", help="Also ask a running `chatstate serve` "
              "(e.g. http://127.0.0.1:8080) for its /readyz.")
@click.pass_obj
def doctor(env: Env, as_json: bool, limit: int, store_only: bool,
           serve_url: str | None) -> None:
    """Readiness check that touches real state; exit 1 when not ready.

    Opens the store (durability guard first), writes, reads back and deletes a
    probe, loads and verifies every conversation (up to --limit), and says what
    the store has survived (reboots, deploys, hosts) from its open records. It
    asks the configured model endpoint for its models (not with --store-only). Then
    the durability table for all of chatstate's state. Only the probe is
    written; conversations are only read. No secret is ever printed.
    """
    from chatstate.errors import ChatstateError
    from chatstate.ops.doctor import diagnose, unreachable
    from chatstate.stores import default_store_url

    try:
        store = env.store(keyless=True)  # an encrypted store's chains check without a key
    except ChatstateError as exc:
        url = env.store_url or default_store_url()
        report = unreachable(url, exc)
    else:
        report = diagnose(store, limit=limit)
    if not store_only:
        from chatstate.ops.model_check import check_model_endpoint

        report.add_model_check(check_model_endpoint())
    if serve_url:
        report.add_serve(serve_url)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    elif sys.stdout.isatty():
        _rich(report)
    else:
        click.echo(_text(report))
    if not report.ready:
        # SystemExit keeps its code through click and common.run() in any mode
        sys.exit(1)


def _summary(report: DoctorReport) -> list[tuple[str, str]]:
    rows = [("store", report.store)]
    if report.durability:
        d = report.durability
        rows.append(("durability", f"{d['verdict']}: " + " ".join(d["reasons"])))
    if report.check:
        c = report.check
        rows.append(("probe", "ok: " + ", ".join(c["steps"]) if c["ok"]
                     else f"FAILED: {c['error']}"))
    if report.encryption:
        rows.append(("encryption", report.encryption))
    if report.conversations:
        c2 = report.conversations
        more = f" (the newest {c2.limit}; --limit to check more)" if c2.more else ""
        bad = f"{len(c2.failures)} FAILED" if c2.failures else "all load and verify"
        inter = f", {c2.interrupted} with an interrupted turn" if c2.interrupted else ""
        rows.append(("conversations", f"{c2.checked} checked{more}: {bad}{inter}"))
    if report.model:
        m = report.model
        rows.append(("model", f"{m['model']} at {m['endpoint']}: {m['detail']}"))
    if report.survived:
        rows.append(("survived", report.survived.sentence()))
    if report.serve:
        s = report.serve
        rows.append(("serve", f"{s['url']}: " + ("ready" if s["ready"] else
                                                 f"NOT READY ({s['reason']})")))
    host = report.host
    rows.append(("this host", f"boot id {host['boot_id'] or '?'}, hostname "
                 f"{host['hostname']}, DEPLOY_ID {host['deploy_id'] or '(unset)'}"))
    return rows


def _text(report: DoctorReport) -> str:
    lines = ["READY" if report.ready else "NOT READY", ""]
    width = max(len(k) for k, _ in _summary(report))
    lines += [f"{k.ljust(width)}  {v}" for k, v in _summary(report)]
    for title, items in (("problems", report.problems), ("warnings", report.warnings),
                         ("recovered on open", report.recovery)):
        if items:
            lines += ["", f"{title}:"] + [f"  - {item}" for item in items]
    lines += ["", "where chatstate keeps its state:"]
    for row in report.state:
        lines += [f"  {row.what}", f"    where:      {row.where}",
                  f"    rebuilt by: {row.rebuilds}",
                  f"    verdict:    {row.verdict}" + (f" ({row.reasons[0]})" if row.reasons
                                                      else "")]
    return "\n".join(lines)


def _rich(report: DoctorReport) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    console.print("[bold green]READY[/]" if report.ready else "[bold red]NOT READY[/]")
    head = Table(show_header=False, box=None)
    for key, value in _summary(report):
        head.add_row(f"[bold]{key}[/]", escape(value))
    console.print(head)
    for title, items, style in (("problem", report.problems, "red"),
                                ("warning", report.warnings, "yellow"),
                                ("recovered on open", report.recovery, "cyan")):
        for item in items:
            console.print(f"[{style}]{title}:[/] {escape(item)}")
    table = Table(title="where chatstate keeps its state", show_lines=True)
    for col in ("state", "where", "rebuilt by", "verdict"):
        table.add_column(col, overflow="fold")
    colour = {"durable": "green", "ephemeral": "red", "unknown": "yellow"}
    for row in report.state:
        verdict = f"[{colour.get(row.verdict, 'default')}]{escape(row.verdict)}[/]"
        if row.reasons:
            verdict += "\n" + escape(row.reasons[0])
        table.add_row(escape(row.what), escape(row.where), escape(row.rebuilds), verdict)
    console.print(table)
