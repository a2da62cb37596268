"""PostgreSQL schema: append-only, named migrations recorded in ``chatstate_migrations``.

Add a migration by appending a function; never edit one that has shipped. They
run on open, in one transaction under an advisory lock, so two processes opening
a blank schema at once do not both create it. A schema that holds tables but no
``chatstate_migrations`` is someone else's and is refused; a migration name this
code does not know means a newer chatstate wrote the schema.

The columns mirror the sqlite store: ``body`` is the message's canonical JSON
(what the hash covers), ``(conversation_id, seq)`` the primary key that makes
compare-and-append hold across hosts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chatstate.errors import ConfigurationError, SchemaVersionError


def m001_initial(db: Any) -> None:
    db.execute("""CREATE TABLE conversations (
        id text PRIMARY KEY,
        title text NOT NULL DEFAULT '',
        created_at text NOT NULL,
        updated_at text NOT NULL,
        metadata text NOT NULL DEFAULT '{}',
        message_count integer NOT NULL DEFAULT 0,
        last_hash text)""")
    db.execute("CREATE INDEX conversations_updated ON conversations (updated_at)")
    db.execute("""CREATE TABLE messages (
        conversation_id text NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
        seq integer NOT NULL,
        body text NOT NULL,
        hash text NOT NULL,
        PRIMARY KEY (conversation_id, seq))""")
    db.execute("""CREATE TABLE partials (
        conversation_id text PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
        seq integer NOT NULL,
        body text NOT NULL)""")
    db.execute("CREATE TABLE opens (id bigserial PRIMARY KEY, record text NOT NULL)")
    db.execute("CREATE TABLE probes (id text PRIMARY KEY, value text NOT NULL)")
    # repair moves a damaged conversation's raw rows here (as JSON), never deleting them
    db.execute("""CREATE TABLE quarantine (id bigserial PRIMARY KEY, conversation_id text
        NOT NULL, quarantined_at timestamptz NOT NULL DEFAULT now(), dump text NOT NULL)""")


def m002_blobs(db: Any) -> None:
    db.execute("CREATE TABLE blobs (sha256 text PRIMARY KEY, data bytea NOT NULL)")


def m003_search(db: Any) -> None:
    # The message's text, written beside its body (parsing the body in the index would
    # make a damaged body unwritable and unreadable); 'simple': whole words, any case.
    db.execute("ALTER TABLE messages ADD COLUMN search_text text NOT NULL DEFAULT ''")
    db.execute("CREATE INDEX messages_text ON messages USING gin "
               "(to_tsvector('simple', search_text))")


def m004_leases(db: Any) -> None:
    db.execute("""CREATE TABLE leases (
        conversation_id text PRIMARY KEY,
        owner text NOT NULL,
        host text NOT NULL,
        pid integer NOT NULL,
        until timestamptz NOT NULL)""")


def m005_blob_age(db: Any) -> None:
    # When each blob was stored (or stored again), for `chatstate gc`; older blobs get
    # the epoch: as old as can be.
    db.execute("ALTER TABLE blobs ADD COLUMN stored_at timestamptz NOT NULL "
               "DEFAULT 'epoch'")


MIGRATIONS: list[Callable[[Any], None]] = [m001_initial, m002_blobs, m003_search, m004_leases,
                                           m005_blob_age]


def migrate(db: Any, schema: str, where: str) -> list[str]:
    """Create the schema if missing and apply the migrations it lacks; return their names."""
    from psycopg import sql

    db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"chatstate:{schema}",))
    db.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    tables = {r[0] for r in db.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname=%s", (schema,)).fetchall()}
    if tables and "chatstate_migrations" not in tables:
        raise ConfigurationError(f"{where}: schema {schema!r} holds tables that are not "
                                 "chatstate's; nothing was written. Use ?schema=another_name.")
    db.execute("CREATE TABLE IF NOT EXISTS chatstate_migrations (name text PRIMARY KEY, "
               "applied_at timestamptz NOT NULL DEFAULT now())")
    applied = {r[0] for r in db.execute("SELECT name FROM chatstate_migrations").fetchall()}
    known = [m.__name__ for m in MIGRATIONS]
    newer = sorted(applied - set(known))
    if newer:
        raise SchemaVersionError(
            f"{where}: the schema was written by a newer chatstate (migration(s) "
            f"{', '.join(newer)} unknown here); upgrade chatstate. Nothing was written.",
            where=where)
    done = []
    for step in MIGRATIONS:
        if step.__name__ not in applied:
            step(db)
            db.execute("INSERT INTO chatstate_migrations (name) VALUES (%s)", (step.__name__,))
            done.append(step.__name__)
    return done
