"""SQLite schema: append-only, named migrations counted in ``PRAGMA user_version``.

Add a migration by appending a function; never edit one that has shipped.
A migration's number is its position in MIGRATIONS (``user_version`` counts
those applied), so merged branches keep their functions in name order. The
runner is ``durable.migrations.run`` (with ``sqlite_setup.SqliteBackend``).

New databases get 512-byte pages (``SqliteConnection``, before WAL is switched
on: the page size of a WAL database is fixed). SQLite writes every page a
commit dirties to the WAL whole, so the page size sets the bytes each fsync
flushes: a turn of two ~700-byte messages wrote 37 KiB of WAL with 4 KiB pages,
12 KiB with 1 KiB pages and 7 KiB with 512-byte ones, while a load of the whole
chain reads ~25% more pages than with 4 KiB. Older files keep their page size.
"""

from __future__ import annotations

import sqlite3

from chatstate.durable.migrations import History, history

APPLICATION_ID = 0x43485354  # "CHST"
PAGE_SIZE = 512


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


def m005_append_at_the_floor(db: sqlite3.Connection) -> None:
    # Every append updated updated_at, so this index dirtied a page (a WAL frame,
    # fsynced) per message; listing sorts the few conversation rows without it.
    # Independent of m004 (blobs): it may run before or after it.
    db.execute("DROP INDEX IF EXISTS conversations_updated")


def m006_leases(db: sqlite3.Connection) -> None:
    # Writer leases (one live writer per conversation): until is a Unix time.
    db.execute("""CREATE TABLE leases (
        conversation_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        until REAL NOT NULL)""")


def m007_blob_age(db: sqlite3.Connection) -> None:
    # When each blob was stored (or stored again), a Unix time, for `chatstate gc`;
    # blobs from before have 0: as old as can be.
    db.execute("ALTER TABLE blobs ADD COLUMN stored_at REAL NOT NULL DEFAULT 0")


def m008_lease_stamps(db: sqlite3.Connection) -> None:
    # Lease expiry by renewals, not wall clocks (stores/leases.py): each write's random
    # stamp, the writer's boot id and monotonic time, and its term. Rows from before
    # have none, and are known by owner and until.
    for column in ("stamp TEXT NOT NULL DEFAULT ''", "boot TEXT NOT NULL DEFAULT ''",
                   "mono REAL", "term REAL"):
        db.execute(f"ALTER TABLE leases ADD COLUMN {column}")


def m009_long_bodies(db: sqlite3.Connection) -> None:
    # The body of a message past LARGE_CONTENT characters, written a slice at a time by
    # incremental blob I/O, which needs a rowid table (messages is WITHOUT ROWID: a row
    # bound whole there cost SQLite two copies of it, 100 MB for a 50 MB reply). Its
    # messages row holds LONG_BODY in place of the body, and its hash as always.
    db.execute("""CREATE TABLE long_bodies (
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        body BLOB NOT NULL,
        UNIQUE (conversation_id, seq))""")


def m010_sealed_binary_rows(db: sqlite3.Connection) -> None:
    # No table changes: from this version on, the body of an encrypted store's sealed
    # message may be a binary row (``stores.codec.binary_row``: a NUL byte, its clear
    # fields, the sealed bytes) standing for its canonical body, which the hash covers as
    # before. Counted so that an older chatstate, which would read such a row as damage
    # ("not valid UTF-8"), refuses the database instead: "schema version 10 is newer than
    # this chatstate knows (9); upgrade chatstate".
    return


LONG_BODY = "{}"
"""What the messages row of a long message holds as its body (no message's body is that)."""
MESSAGE_BODY = ("CAST(CASE WHEN body = '{}' THEN (SELECT l.body FROM long_bodies l WHERE "
                "l.conversation_id = messages.conversation_id AND l.seq = messages.seq) "
                "ELSE body END AS BLOB)")
"""A messages row's body as stored, read from ``long_bodies`` for a long one (bytes)."""

MIGRATIONS: History[sqlite3.Connection] = history(
    m001_initial, m002_search, m003_search_lazily, m004_blobs, m005_append_at_the_floor,
    m006_leases, m007_blob_age, m008_lease_stamps, m009_long_bodies,
    m010_sealed_binary_rows)
