"""What a killed writer may leave behind, per store, after a fresh open has recovered.

Only the drill's own conversations are looked at, so a user's chat running
on the same store at the same time cannot make the drill fail:

- json: no ``.<id>.json.tmp-*`` file in the store or ``.partials/``, and every
  ``.locks/<id>.lock`` can be flock'ed at once (non-blocking);
- sqlite: no ``-journal`` file (the store runs in WAL mode) and ``BEGIN
  IMMEDIATE`` succeeds at once on a fresh connection;
- s3: under ``conversations/<id>/`` only the header, the message segments and
  snapshots of stored seqs and the one partial reply, as far as listing shows.

``cleanup`` deletes the drill's conversations (and, for json, their lock files).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import Any

from ..errors import ChatstateError, ConversationNotFound

_S3_KEY = re.compile(r"(?:header|partial)\.json|(?P<dir>m|snap)/(?P<seq>\d{10})\.json")


def leftovers(store: Any, ids: Sequence[str], counts: dict[str, int]) -> list[str]:
    """Problems found; ``counts`` is the stored message count per conversation."""
    from ..stores.jsonfile import JsonStore
    from ..stores.sqlite import SqliteStore

    if isinstance(store, JsonStore):
        return _json(store, ids)
    if isinstance(store, SqliteStore):
        return _sqlite(store)
    if type(store).__name__ == "S3Store":
        return _s3(store, ids, counts)
    return []


def _json(store: Any, ids: Sequence[str]) -> list[str]:
    from ..stores._files import locked, temp_target

    targets = {f"{cid}.json" for cid in ids}
    problems = []
    for directory in (store.root, store.root / ".partials"):
        for path in directory.glob(".*"):
            if temp_target(path.name) in targets:
                problems.append(f"temp file {path} left after recovery")
    for cid in ids:
        lock = store.root / ".locks" / f"{cid}.lock"
        if lock.exists():
            with locked(lock, blocking=False) as got:
                if not got:
                    problems.append(f"{lock} is still locked after the writer died")
    return problems


def _sqlite(store: Any) -> list[str]:
    problems = []
    journal = store.path.with_name(store.path.name + "-journal")
    if journal.exists():
        problems.append(f"{journal} left behind (the store runs in WAL mode)")
    db = sqlite3.connect(store.path, timeout=0, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        problems.append(f"{store.path}: BEGIN IMMEDIATE failed at once ({exc}): a lock is "
                        "still held after the writer died")
    finally:
        db.close()
    return problems


def _s3(store: Any, ids: Sequence[str], counts: dict[str, int]) -> list[str]:
    from ..stores import _s3doc as doc

    problems = []
    for cid in ids:
        base = doc.conv_dir(cid) + "/"
        for key, _ in store.io.keys(doc.conv_dir(cid)):
            rest = key[len(base):] if key.startswith(base) else key
            match = _S3_KEY.fullmatch(rest)
            if match is None:
                problems.append(f"orphan object {key} (not part of the store's layout)")
            elif match["seq"] is not None and int(match["seq"]) >= counts.get(cid, 0):
                problems.append(f"orphan object {key}: beyond the stored chain "
                                f"({counts.get(cid, 0)} messages)")
    return problems


def cleanup(store: Any, ids: Sequence[str]) -> list[str]:
    """Delete the drill's conversations (and json lock files). Returns problems.

    The drill only ever uses ``ids``; it does not list the store, which would
    read the headers of the user's conversations.
    """
    from ..stores.jsonfile import JsonStore

    problems = []
    for cid in ids:
        try:
            store.delete(cid)
        except ConversationNotFound:
            pass
        except ChatstateError as exc:
            problems.append(f"could not delete drill conversation {cid}: {exc}")
    if isinstance(store, JsonStore):
        for cid in ids:
            (store.root / ".locks" / f"{cid}.lock").unlink(missing_ok=True)
    return problems
