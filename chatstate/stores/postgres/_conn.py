"""The postgresql store's connection: URL, pool, error translation, the server guard.

``postgresql://user@host:5432/db?schema=chatstate``: credentials come from the
URL, the libpq environment (PGPASSWORD, PGSERVICE, ...) or ``~/.pgpass``, and are
handed to libpq only: ``self.url`` is the redacted URL, and every message that
leaves this module goes through ``redact.scrub`` with the password as a secret.

Every psycopg error becomes a chatstate error here and nowhere else.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from chatstate.core.redact import redact_url, scrub
from chatstate.durable.uninterruptible import uninterruptible
from chatstate.errors import (
    ChatstateError,
    ConfigurationError,
    ConflictError,
    ConversationInUse,
    InvalidStoreURL,
    StoreUnavailable,
)
from chatstate.stores.base import Location

SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
QUERY_KEYS = ("schema", "pool_size", "connect_timeout", "sslmode", "application_name",
              "lock_timeout", "idle_in_transaction_timeout", "guard_interval")
# seconds: how long a write waits for a row another transaction holds (then "in use"),
# and how long the server lets a session sit idle inside a transaction (a frozen
# writer's locks are freed by the server after that)
# and how often a writing client asks the server again how it acknowledges commits
TIMEOUTS = {"lock_timeout": 10.0, "idle_in_transaction_timeout": 60.0, "guard_interval": 60.0}
EXAMPLE = "postgresql://user@host:5432/db?schema=chatstate"


def _bad_url(url: str, why: str) -> NoReturn:
    raise InvalidStoreURL(f"store URL {redact_url(url)!r}: {why}. Example: {EXAMPLE} (the "
                          "password may come from PGPASSWORD or ~/.pgpass instead of the URL)")


class PgTarget:
    """A parsed store URL: the libpq conninfo (secret) and the schema. No I/O."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            _bad_url(url, "the scheme must be postgresql://")
        try:
            query = dict(parse_qsl(parts.query, strict_parsing=bool(parts.query)))
            parts.port  # noqa: B018  (raises on a malformed port)
        except ValueError:
            _bad_url(url, "the query string or port is malformed")
        unknown = sorted(set(query) - set(QUERY_KEYS))
        if unknown:
            _bad_url(url, f"unknown parameter(s) {', '.join(unknown)}; use {', '.join(QUERY_KEYS)}")
        self.schema = query.pop("schema", "chatstate")
        if not SCHEMA_RE.fullmatch(self.schema):
            _bad_url(url, f"schema {self.schema!r} must be 1-63 of [a-z0-9_], not starting "
                     "with a digit")
        try:
            self.pool_size = int(query.pop("pool_size", "4"))
        except ValueError:
            _bad_url(url, "pool_size must be a whole number")
        self.timeouts: dict[str, float] = {}
        for key, default in TIMEOUTS.items():
            try:
                self.timeouts[key] = float(query.pop(key, default))
            except ValueError:
                _bad_url(url, f"{key} must be a number of seconds")
            if not 0 < self.timeouts[key] < 86400:
                _bad_url(url, f"{key} must be between 0 and 86400 seconds")
        self.password = unquote(parts.password) if parts.password else None
        self.conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path,
                                    urlencode(query), ""))
        # the store's own URL: the same, less the password (it parses again, and
        # redact_url still hides the user name wherever it is shown)
        netloc = parts.netloc.rsplit("@", 1)
        user = netloc[0].split(":", 1)[0] + "@" if len(netloc) == 2 else ""
        self.url = urlunsplit((parts.scheme, user + netloc[-1], parts.path, parts.query, ""))
        host = parts.hostname or "localhost (unix socket)"
        self.shown = f"{host}:{parts.port or 5432}{parts.path or '/'} schema {self.schema}"

    def scrub(self, text: str) -> str:
        return scrub(text, self.password)


class PgConnection:
    """Pool lifecycle and the one error boundary of the postgresql store."""

    def __init__(self, target: PgTarget, url: str) -> None:
        self.target = target
        self.url = target.url
        self.recovery: list[str] = []
        self._pool: Any = None
        # the guard again: before the first write on each new pooled connection (a
        # reconnect after a restart included) and every guard_interval seconds; a server
        # that turned ephemeral after open is refused unless it was so (allowed) at open
        self.verdict_at_open = "durable"
        self._guard_due = 0.0

    def location(self) -> Location:
        return Location(url=self.url, path=None, remote=f"PostgreSQL {self.target.shown}")

    def _connect_pool(self) -> None:
        from psycopg_pool import ConnectionPool

        t = self.target.timeouts
        options = (f"-c search_path={self.target.schema} "
                   f"-c lock_timeout={int(t['lock_timeout'] * 1000)} "
                   "-c idle_in_transaction_session_timeout="
                   f"{int(t['idle_in_transaction_timeout'] * 1000)}")
        self._pool = ConnectionPool(
            self.target.conninfo, min_size=1, max_size=max(1, self.target.pool_size),
            kwargs={"options": options, "connect_timeout": 10}, open=False, num_workers=1,
            name="chatstate", timeout=30, check=ConnectionPool.check_connection,
            configure=self._new_connection)
        with self._errors("connect to"):
            self._pool.open(wait=True, timeout=30)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @contextmanager
    def _tx(self, action: str, *, read_only: bool = False) -> Iterator[Any]:
        """A connection inside one transaction, committed when the block ends.

        Reads run REPEATABLE READ so header, messages and partial are one snapshot.
        """
        if self._pool is None:
            raise ConfigurationError(f"store {self.url} is not open: use chatstate.open_store()")
        # Ctrl-C is held back from BEGIN to COMMIT: a KeyboardInterrupt raised inside
        # psycopg mid-query leaves the connection busy, and the pool hands it out again
        with self._errors(action), self._pool.connection() as conn, uninterruptible(), \
                conn.transaction():
            if read_only:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            elif time.monotonic() >= self._guard_due:
                self.recheck_server(conn)
            yield conn

    def _new_connection(self, conn: Any) -> None:
        self._guard_due = 0.0  # a new (or reconnected) session: check before its first write

    def recheck_server(self, conn: Any) -> None:
        """The durability guard on ``conn``'s server; raise the guard's error once it is unsafe."""
        from chatstate.stores import refuse_ephemeral
        from chatstate.stores.postgres._guard import server_report

        report = server_report(conn, self.target.shown, self.url)
        if report.verdict == "ephemeral" and self.verdict_at_open != "ephemeral":
            refuse_ephemeral(self.url, report)  # and again on every write until it is safe
        self._guard_due = time.monotonic() + self.target.timeouts["guard_interval"]

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """psycopg errors -> chatstate errors, secrets scrubbed (the one boundary)."""
        import psycopg
        from psycopg import errors as pge

        try:
            yield
        except ChatstateError:
            raise
        except pge.UniqueViolation as exc:
            raise ConflictError(self.target.scrub(
                f"{self.url}: could not {action} the store: another writer got there first "
                f"({exc.diag.constraint_name}); reload and retry")) from None
        except pge.LockNotAvailable as exc:
            raise ConversationInUse(self.target.scrub(
                f"{self.url}: could not {action} the store: a conversation it needs is in use "
                f"by another writer's open transaction ({first_line(exc)} after "
                f"lock_timeout={self.target.timeouts['lock_timeout']:g} s); nothing was "
                "written. Try again when it finishes, or raise lock_timeout in the URL"
            )) from None
        except (pge.AdminShutdown, pge.CannotConnectNow) as exc:
            raise StoreUnavailable(self.target.scrub(
                f"could not {action} {self.url}: the server restarted or is shutting down "
                f"({first_line(exc)}). The outcome of a write is unknown; retrying the same "
                "append is safe once it is back")) from None
        except pge.ReadOnlySqlTransaction as exc:
            raise StoreUnavailable(self.target.scrub(
                f"could not {action} {self.url}: the server is read-only or shutting down "
                f"({first_line(exc)}); point the URL at the primary")) from None
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(self.target.scrub(
                f"could not {action} {self.url}: {first_line(exc)}. The outcome of a write "
                "is unknown; retrying the same append is safe")) from None
        except psycopg.Error as exc:
            raise StoreUnavailable(self.target.scrub(
                f"could not {action} {self.url}: {type(exc).__name__}: {first_line(exc)}"
            )) from None
        except Exception as exc:
            if type(exc).__module__.startswith("psycopg_pool"):  # PoolTimeout, TooManyRequests
                raise StoreUnavailable(self.target.scrub(
                    f"could not {action} {self.url}: {first_line(exc)}")) from None
            raise


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
