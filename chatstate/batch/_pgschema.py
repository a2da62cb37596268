"""The shared ledger's URL (``?schema=`` is ours) and its schema: named, append-only migrations.

Add a migration by appending a function; never edit one that has shipped. Each
runs with the ledger's schema as its ``search_path``; ``pgledger`` applies the
missing ones (``durable.migrations.run`` with its ``PgBackend``) in one
transaction under an advisory lock, and records their names in
``<schema>.migrations``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from chatstate.durable.migrations import History, history
from chatstate.errors import InvalidStoreURL

DEFAULT_SCHEMA = "chatstate_batch"


def is_url(value: str) -> bool:
    return value.startswith(("postgresql://", "postgres://"))


def shown(url: str) -> str:
    """The URL without its password or query, for messages."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username
    return urlunsplit((parts.scheme, f"{user}@{host}" if user else host, parts.path, "", ""))


def split_schema(url: str) -> tuple[str, str]:
    """(libpq URL, schema): ``?schema=`` is ours, libpq would refuse it."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [v for k, v in query if k == "schema"]
    schema = schemas[-1] if schemas else DEFAULT_SCHEMA
    if not schema.isidentifier() or schema.lower() != schema:
        raise InvalidStoreURL(f"invalid schema {schema!r} in the ledger URL {shown(url)}: use "
                              "lowercase letters, digits and '_'")
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema


def m001_initial(db: Any) -> None:
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    # seq is the input order; claims take the lowest claimable seq first.
    db.execute("""CREATE TABLE records (
        seq BIGSERIAL UNIQUE,
        id TEXT PRIMARY KEY,
        text TEXT NOT NULL,
        text_sha256 TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'running', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        output_path TEXT NOT NULL UNIQUE,
        output_sha256 TEXT,
        writing_sha256 TEXT,
        conversation_id TEXT,
        worker TEXT,
        lease_until TIMESTAMPTZ,
        last_error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        done_at TEXT)""")
    db.execute("CREATE INDEX records_claimable ON records(status, seq)")
    db.execute("CREATE INDEX records_worker ON records(worker) WHERE worker IS NOT NULL")
    db.execute("""CREATE TABLE workers (
        id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, boot_id TEXT,
        start_ticks BIGINT, started_at TEXT NOT NULL, ended_at TEXT)""")


MIGRATIONS: History[Any] = history(m001_initial)
MIGRATIONS_TABLE = "migrations"
MIGRATIONS_COLUMNS = "name TEXT PRIMARY KEY, applied_at TEXT NOT NULL"
