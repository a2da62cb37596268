"""`chatstate batch run|status|verify|recover`: the resumable batch runner, from a shell.

A thin shell over ``chatstate.batch.Batch``: notes (probe verdicts, recovery,
progress) go to stderr, the summary and verdicts to stdout. Exit codes: 0 all
good, 1 a record failed or verify found a violation, 130 interrupted.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from chatstate.cli.common import Env
from chatstate.cli.mcp_options import allow_listed_mcp_options, open_mcp
from chatstate.cli.turns import api_option

PLAIN_EVERY = 5.0  # seconds between progress lines when stderr is not a terminal


def _where(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--ledger", metavar="PATH|URL", help="The SQLite ledger (default: "
                     "DIR/.chatstate-batch.db), or postgresql://… shared by many hosts.")(f)
    return click.option("--out", "out", required=True, metavar="DIR|URL",
                        help="The output directory: one file per record; or "
                        "s3://bucket/prefix?endpoint_url=… shared by many hosts.")(f)


_live: list[Any] = []  # the rich console of the progress bar on screen, if one is


def _echo(line: str) -> None:
    if _live:  # above the bar, which rich then redraws below: no glued or stale lines
        _live[0].print(line, markup=False, highlight=False, soft_wrap=True)
    else:
        click.echo(line, err=True)


class _ThroughBar:
    """A stream for the log handlers while the bar is up: each line goes above it."""

    def write(self, text: str) -> int:
        if text.strip():
            _echo(text.rstrip("\n"))
        return len(text)

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def _logs_through_bar() -> Iterator[None]:
    import logging

    handlers = [h for h in logging.getLogger("chatstate").handlers
                if isinstance(h, logging.StreamHandler)]
    streams = [h.setStream(_ThroughBar()) for h in handlers]
    try:
        yield
    finally:
        for handler, stream in zip(handlers, streams, strict=True):
            handler.setStream(stream)


@click.group()
def batch() -> None:
    """Resumable batch runner: one prompt over many records, one output file each.

    Survives kill -9, restarts and redeploys: rerun the same command and it
    picks up where it stopped, never calling the model again for a record
    that is done. `batch verify` proves the output directory and the ledger agree.
    """


@batch.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(exists=True))
@click.option("--prompt", required=True, metavar="TEMPLATE",
              help="The prompt; {text} and {id} are replaced by the record's.")
@_where
@click.option("--system", metavar="TEXT", help="A system message for every call.")
@click.option("--model", "-m", metavar="M", help="Model name; 'fake' runs the built-in "
              "fake model in this process.")
@click.option("--base-url", metavar="URL", help="OpenAI-compatible endpoint (default: "
              "CHATSTATE_BASE_URL / OPENAI_BASE_URL).")
@api_option
@click.option("--concurrency", "-j", type=click.IntRange(1, 512), default=4, show_default=True,
              help="Model requests in flight at once.")
@click.option("--max-attempts", type=click.IntRange(1, 100), default=None,
              help="Model requests per record, retries included, before it is failed "
                   "(default: the ledger's last value, else 3).")
@click.option("--limit", type=click.IntRange(0), default=None,
              help="Process at most N records in this run.")
@click.option("--transcripts", is_flag=True, help="Also keep each call as a one-turn "
              "conversation in the transcript store (--store), for replay.")
@click.option("--retry-failed", is_flag=True, help="Give records that ended 'failed' fresh "
              "attempts (once their cause is fixed).")
@click.option("--host-id", metavar="NAME", help="This worker's host name in a shared ledger "
              "(default: CHATSTATE_HOST_ID, else the hostname).")
@click.option("--lease", type=click.FloatRange(0.5), default=30.0, show_default=True,
              metavar="SECONDS", help="Shared ledger: how long a claim holds without a "
              "heartbeat before another worker may take it over.")
@allow_listed_mcp_options
@click.pass_obj
def run(env: Env, input_path: str, prompt: str, out: str, ledger: str | None,
        system: str | None, model: str | None, base_url: str | None, concurrency: int,
        max_attempts: int | None, limit: int | None, transcripts: bool,
        retry_failed: bool, host_id: str | None, lease: float, mcp_config: Path | None,
        mcp_commands: tuple[str, ...]) -> None:
    """Run TEMPLATE over every record of INPUT (.jsonl or directory).

    Rerun the same command after a crash: it recovers first, then carries on.
    With MCP servers (--mcp-config, --mcp; needs --transcripts) the model may
    call their read-only and allow-listed tools; any other is answered "not run".
    """
    from chatstate.batch import Batch

    if (mcp_config or mcp_commands) and not transcripts:
        raise click.UsageError("MCP tools in a batch need --transcripts: every step of the "
                               "tool loop is stored, so a rerun never repeats a call")
    with contextlib.ExitStack() as stack:
        api_key = None
        if (model or "").lower() in ("fake", "offline"):
            from chatstate.cli.turns import fake_reply_words
            from chatstate.testing import FakeModel

            fake = stack.enter_context(FakeModel(reply_words=fake_reply_words()))
            base_url, model, api_key = fake.base_url, "fake", "offline"
        store = env.store() if transcripts else None
        mcp = open_mcp(mcp_config, mcp_commands, "allow-list", _echo)
        if mcp is not None:
            stack.callback(mcp.close)
        job = stack.enter_context(Batch(
            out, prompt=prompt, ledger=ledger, system=system, model=model, base_url=base_url,
            api_key=api_key, concurrency=concurrency, max_attempts=max_attempts,
            transcripts=store, allow_ephemeral=env.allow_ephemeral, echo=_echo,
            host_id=host_id, lease=lease, tools=mcp))
        with _progress() as show:
            summary = job.run(input_path, limit=limit, progress=show,
                              retry_failed=retry_failed)
    for line in summary.lines():
        click.echo(line)
    if summary.interrupted:
        raise click.exceptions.Exit(130)
    if not summary.ok:
        raise click.exceptions.Exit(1)


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[Any], None]]:
    """A rich progress bar on a terminal; otherwise a plain line every few seconds."""
    if not sys.stderr.isatty():
        last = [time.monotonic()]

        def plain(p: Any) -> None:
            if time.monotonic() - last[0] >= PLAIN_EVERY:
                last[0] = time.monotonic()
                _echo(p.line())

        yield plain
        return
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn
    from rich.progress import Progress as Bar

    console = Console(stderr=True)
    bar = Bar(TextColumn("batch"), BarColumn(), TextColumn("{task.fields[line]}"),
              console=console, transient=True)
    task = bar.add_task("batch", total=None, line="starting")
    with bar, _logs_through_bar():
        def show(p: Any) -> None:
            bar.update(task, completed=p.counts["done"] + p.counts["failed"], total=p.total,
                       line=p.line().removeprefix("batch: "))

        _live.append(console)
        try:
            yield show
        finally:
            _live.clear()


@batch.command()
@_where
@click.option("--json", "as_json", is_flag=True, help="Print counts and failures as JSON.")
@click.pass_obj
def status(env: Env, out: str, ledger: str | None, as_json: bool) -> None:
    """Counts by status, and why records failed."""
    from chatstate.batch import Batch

    with Batch(out, ledger=ledger, echo=_echo) as job:
        counts, failures = job.status(), job.failures()
        if as_json:
            click.echo(json.dumps({"counts": counts, "total": sum(counts.values()),
                                   "failures": [{"id": i, "error": e} for i, e in failures]}))
            return
        click.echo(f"ledger {job.ledger_where}\noutputs {job.outputs.where}")
        click.echo(f"{sum(counts.values())} records: " + ", ".join(
            f"{n} {state}" for state, n in counts.items()))
        for rid, error in failures:
            click.echo(f"failed {rid!r}: {error}")


@batch.command()
@_where
@click.pass_obj
def verify(env: Env, out: str, ledger: str | None) -> None:
    """Prove the batch is consistent; exit 1 naming every violation.

    No record is left running, every done record's file exists and matches its
    sha256, and the files in DIR are exactly the done records' outputs.
    """
    from chatstate.batch import Batch

    with Batch(out, ledger=ledger, echo=_echo) as job:
        problems = job.verify()
        counts = job.status()
    for problem in problems:
        click.echo(f"violation: {problem}")
    if problems:
        click.echo(f"verify failed: {len(problems)} violation(s)")
        raise click.exceptions.Exit(1)
    click.echo(f"verify ok: {counts['done']} done record(s), each output present and matching "
               f"its sha256, no other files ({counts['pending']} pending, "
               f"{counts['failed']} failed)")


@batch.command()
@_where
@click.option("--quarantine", is_flag=True, help="Move output files that belong to no done "
              "record to DIR/.quarantine/ (never deleted).")
@click.pass_obj
def recover(env: Env, out: str, ledger: str | None, quarantine: bool) -> None:
    """Recover now, as every run does first, and say what was done."""
    from chatstate.batch import Batch

    with Batch(out, ledger=ledger, allow_ephemeral=env.allow_ephemeral, echo=_echo) as job:
        found = job.recover(quarantine=quarantine)
    if not found.notes():
        click.echo("nothing to recover")
