"""SQLite schema: append-only, named migrations keyed on ``PRAGMA user_version``.

Add a migration by appending a function; never edit one that has shipped.
``application_id`` marks the file as chatstate's, so a foreign database is
refused instead of being written into.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

APPLICATION_ID = 0x43485354  # "CHST"


def m001_initial(db: sqlite3.Connection) -> None:
    db.execute("""CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{}',
        message_count INTEGER NOT NULL DEFAULT 0,
        last_hash TEXT)""")
    db.execute("CREATE INDEX conversations_updated ON conversations(updated_at)")
    # body is the message's canonical JSON (what the hash covers), so verifying a
    # load costs one sha256 per row and no re-serialisation.
    db.execute("""CREATE TABLE messages (
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        hash TEXT NOT NULL,
        PRIMARY KEY (conversation_id, seq)) WITHOUT ROWID""")
    db.execute("""CREATE TABLE partials (
        conversation_id TEXT PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        body TEXT NOT NULL)""")
    db.execute("CREATE TABLE opens (id INTEGER PRIMARY KEY, record TEXT NOT NULL)")
    db.execute("CREATE TABLE probes (id TEXT PRIMARY KEY, value TEXT NOT NULL)")


def m002_search(db: sqlite3.Connection) -> None:
    try:
        db.execute("""CREATE VIRTUAL TABLE message_text USING fts5(
            content, conversation_id UNINDEXED, seq UNINDEXED)""")
    except sqlite3.OperationalError:  # SQLite built without FTS5: search falls back to a scan
        return


def m003_search_lazily(db: sqlite3.Connection) -> None:
    # The full-text index is brought up to date by search(), not by every append:
    # an FTS5 insert per message doubled the WAL bytes (and the time) of a turn.
    db.execute("""CREATE TABLE search_progress (
        conversation_id TEXT PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
        indexed INTEGER NOT NULL)""")
    if db.execute("SELECT 1 FROM sqlite_master WHERE name='message_text'").fetchone():
        db.execute("INSERT INTO search_progress SELECT conversation_id, max(seq) + 1 "
                   "FROM message_text GROUP BY conversation_id")


def m004_blobs(db: sqlite3.Connection) -> None:
    # Images and files named by messages, once per digest. A rowid table (not WITHOUT
    # ROWID): its rows are large, and SQLite keeps large rows out of the b-tree pages.
    db.execute("""CREATE TABLE blobs (
        sha256 TEXT PRIMARY KEY,
        data BLOB NOT NULL)""")


def m005_leases(db: sqlite3.Connection) -> None:
    # Writer leases (one live writer per conversation): until is a Unix time.
    db.execute("""CREATE TABLE leases (
        conversation_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        until REAL NOT NULL)""")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    m001_initial, m002_search, m003_search_lazily, m004_blobs, m005_leases]
