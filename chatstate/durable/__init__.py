"""The durable layer: bytes that survive, below any store.

The durability guard (``guard``), atomic local files and locks (``files``), SQLite
connections set up for durability (``sqlite_setup``), the one runner of named,
append-only schema migrations (``migrations``), and Ctrl-C held back inside a write
(``uninterruptible``). It knows nothing of transcripts.
"""
