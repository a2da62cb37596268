"""What a killed json writer may leave that a fresh open did not recover (``leftovers``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from chatstate.durable.files import locked, temp_target


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
