"""What a killed writer may leave behind, per built-in store, after a fresh open recovered.

The stores' ``leftovers`` methods (the optional ``ReportsLeftovers`` part of the
Store protocol) delegate here. Only the given conversations are looked at, so
another user of the same store cannot make a check fail.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from . import _s3doc as doc
from ._files import locked, temp_target

if TYPE_CHECKING:
    from ._s3io import S3IO

_S3_KEY = re.compile(r"(?:header|partial)\.json|(?P<dir>m|snap)/(?P<seq>\d{10})\.json")


def json_leftovers(root: Path, ids: Sequence[str]) -> list[str]:
    """No ``.<id>.json.tmp-*`` file in DIR or ``.partials/``; every ``.locks/<id>.lock`` free."""
    targets = {f"{cid}.json" for cid in ids}
    problems = []
    for directory in (root, root / ".partials"):
        for path in directory.glob(".*"):
            if temp_target(path.name) in targets:
                problems.append(f"temp file {path} left after recovery")
    for cid in ids:
        lock = root / ".locks" / f"{cid}.lock"
        if lock.exists():
            with locked(lock, blocking=False) as got:
                if not got:
                    problems.append(f"{lock} is still locked after the writer died")
    return problems


def json_forget(root: Path, ids: Sequence[str]) -> None:
    for cid in ids:
        (root / ".locks" / f"{cid}.lock").unlink(missing_ok=True)
        (root / ".locks" / f"{cid}.lease").unlink(missing_ok=True)


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


def s3_leftovers(io: S3IO, ids: Sequence[str], counts: Mapping[str, int]) -> list[str]:
    """Under ``conversations/<id>/`` only the header, the segments and snapshots of stored
    seqs and the one partial reply, as far as listing shows."""
    problems = []
    for cid in ids:
        base = doc.conv_dir(cid) + "/"
        for key, _ in io.keys(doc.conv_dir(cid)):
            rest = key[len(base):] if key.startswith(base) else key
            match = _S3_KEY.fullmatch(rest)
            if match is None:
                problems.append(f"orphan object {key} (not part of the store's layout)")
            elif match["seq"] is not None and int(match["seq"]) >= counts.get(cid, 0):
                problems.append(f"orphan object {key}: beyond the stored chain "
                                f"({counts.get(cid, 0)} messages)")
    return problems
