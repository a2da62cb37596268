"""What a killed sqlite writer may leave that a fresh open did not recover (``leftovers``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def sqlite_leftovers(path: Path) -> list[str]:
    """No ``-journal`` file (the store runs in WAL mode); BEGIN IMMEDIATE succeeds at once."""
    problems = []
    journal = path.with_name(path.name + "-journal")
    if journal.exists():
        problems.append(f"{journal} left behind (the store runs in WAL mode)")
    db = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        problems.append(f"{path}: BEGIN IMMEDIATE failed at once ({exc}): a lock is still "
                        "held after the writer died")
    finally:
        db.close()
    return problems
