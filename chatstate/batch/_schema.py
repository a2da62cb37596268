"""The batch ledger's schema: append-only, named migrations counted in ``PRAGMA user_version``.

Add a migration by appending a function; never edit one that has shipped. The
runner is ``durable.migrations.run`` (with ``sqlite_setup.SqliteBackend``).
``application_id`` marks the file as a chatstate batch ledger, so a foreign
database (or a transcript store) is refused instead of being written into.
"""

from __future__ import annotations

import sqlite3

from chatstate.durable.migrations import History, history

APPLICATION_ID = 0x43534254  # "CSBT"


def m001_initial(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    # rowid is the input order; claims take the lowest pending rowid first.
    # output_sha256 is set only with status 'done'; writing_sha256 is the hash of
    # the output a running worker is about to rename into place, so recovery can
    # adopt a file that landed just before its writer was killed.
    db.execute("""CREATE TABLE records (
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
        last_error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        done_at TEXT)""")
    db.execute("CREATE INDEX records_status ON records(status)")
    db.execute("CREATE INDEX records_worker ON records(worker) WHERE worker IS NOT NULL")
    db.execute("""CREATE TABLE workers (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        boot_id TEXT,
        start_ticks INTEGER,
        started_at TEXT NOT NULL,
        ended_at TEXT)""")


MIGRATIONS: History[sqlite3.Connection] = history(m001_initial)
