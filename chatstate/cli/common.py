"""What every subcommand shares: the global options, opening the store, errors and logs."""

from __future__ import annotations

import json
import logging
import sys
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from chatstate.stores.base import OpenedStore

log = logging.getLogger("chatstate")


@dataclass
class Env:
    """The global options, passed to subcommands as ``ctx.obj``."""

    store_url: str | None = None
    allow_ephemeral: bool = False
    debug: bool = False
    log_format: str = "text"
    verbose: bool = False
    quiet: bool = False  # -q: notices off (warnings, errors and what a command asked for stay)
    _store: OpenedStore | None = field(default=None, repr=False)

    def setup_logging(self) -> None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter() if self.log_format == "json"
                             else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger("chatstate")
        root.handlers[:] = [handler]
        root.setLevel(logging.DEBUG if self.debug else logging.WARNING)

    def store(self, *, quiet: bool = False, writes: bool = True,
              keyless: bool = False) -> OpenedStore:
        """Open the store once; print where its bytes land and the verdict to stderr first.

        The line is printed when the command writes (invariant 8: location and verdict at
        startup) unless -q, for a read-only command (``writes=False``) only with -v; a
        verdict other than durable, and any recovery, are printed always. ``keyless``: an
        encrypted store opens without its key, its records sealed (for the checks that
        need no key)."""
        if self._store is None:
            from chatstate.stores import open_store

            self._store = store = open_store(self.store_url,
                                             allow_ephemeral=self.allow_ephemeral,
                                             keyless=keyless)
            ctx = click.get_current_context(silent=True)
            if ctx is not None:  # close (sqlite: release the connection) when the command ends
                ctx.call_on_close(self.close)
            if not quiet:
                shown = self.verbose or (writes and not self.quiet)
                describe_store(store, durable_line=shown)
            return store
        return self._store

    def reader(self) -> OpenedStore:
        """The store for a command that only reads it: its durable line only with -v."""
        return self.store(writes=False)

    def notice(self, text: str) -> None:
        """A notice on stderr (what happened, a hint): silenced by -q."""
        if not self.quiet:
            click.echo(text, err=True)

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()


def describe_store(store: OpenedStore, *, durable_line: bool = True) -> None:
    """The store's location and verdict on stderr; a durable verdict only if ``durable_line``
    (any other verdict is a warning, always shown), then what recovery did."""
    report = store.guard_report
    line = f"store {store.url} {report.one_line()}"
    if report.verdict != "durable":
        line += " (" + " ".join(report.reasons[:1]) + ")"
    if durable_line or report.verdict != "durable":
        click.echo(line, err=True)
    for note in store.recovery:
        click.echo(f"recovered: {note}", err=True)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"level": record.levelname.lower(), "logger": record.name,
                "message": record.getMessage(), "time": record.created}
        fields = getattr(record, "fields", None)  # structured extras (serve's access log)
        if isinstance(fields, dict):
            line.update({k: v for k, v in fields.items() if k not in line})
        return json.dumps(line)


def run(cli: click.Group, argv: list[str] | None) -> int:
    """Invoke the CLI; chatstate errors become one clear paragraph and exit 1."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        # Without standalone mode click *returns* the code of an Exit (our `fail`,
        # ctx.exit) instead of raising it; commands themselves return None.
        result = cli.main(args=argv, prog_name="chatstate", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 1
    except Exception as exc:
        from chatstate.errors import ChatstateError

        if debug:
            traceback.print_exc()
        name = type(exc).__name__
        if isinstance(exc, ChatstateError):
            click.echo(f"error: {exc}", err=True)
        else:
            click.echo(f"error: unexpected {name}: {exc}. Rerun with --debug for the "
                       "traceback, and please report it.", err=True)
        return 1
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def fail(message: str, code: int = 1) -> None:
    """Print one paragraph to stderr and exit with ``code``."""
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(code)
