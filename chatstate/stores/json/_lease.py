"""The json store's writer lease: ``DIR/.locks/<id>.lease``.

A small JSON file rewritten atomically under the conversation's flock. The flock
alone would not do: it dies with its holder at once, while a lease must outlive a
short stall and lapse only after its term.

The lease is taken under ``.locks/<id>.lock``, the very flock every write of the
conversation holds, so a fenced write checks the lease file under the lock it
already holds: one lock, no lock order to get wrong (and never re-taken inside it:
flock is per open file, a second take by the same process would wait for itself).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chatstate.core.transcript import validate_id
from chatstate.stores.leases import (
    Holder,
    Lease,
    LeaseMethods,
    check_fence,
    holder_of,
    lease_record,
)


class JsonLease(LeaseMethods):
    root: Path
    recovery: list[str]

    def _remove_lease_temps(self) -> None:
        """Temp files of lease writes a killed writer left in ``.locks`` (on open)."""
        from chatstate.durable.files import TMP_MARK, locked, remove_durably, temp_target

        for tmp in sorted((self.root / ".locks").glob(f".*.lease{TMP_MARK}*")):
            target = temp_target(tmp.name)
            if target is None or not target.endswith(".lease"):
                continue
            with locked(tmp.parent / (target.removesuffix(".lease") + ".lock"),
                        blocking=False) as got:
                if got:  # no live writer holds the conversation: a dead writer's
                    remove_durably(tmp)
                    self.recovery.append(f"removed {tmp.name}, a temp file left by a killed "
                                         "writer")

    def _lease_file(self, cid: str) -> Path:
        return self.root / ".locks" / f"{validate_id(cid)}.lease"

    @staticmethod
    def _read_lease(path: Path) -> Any:
        from chatstate.durable.files import read_bytes

        raw = read_bytes(path)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None  # a torn lease is no lease: the atomic write makes that rare

    def _check_fence(self, cid: str, fence: str | None) -> None:
        """LeaseLost unless ``fence`` owns the lease; the caller holds ``.locks/<id>.lock``."""
        if fence is not None:
            path = self._lease_file(cid)
            check_fence(str(path), cid, fence, self._read_lease(path))

    def _try_lease(self, lease: Lease) -> Holder | None:
        from chatstate.durable.files import atomic_write, locked

        path = self._lease_file(lease.conversation_id)
        with locked(path.with_suffix(".lock")):  # the conversation's lock (see above)
            held = self._read_lease(path)
            holder = holder_of(held, lease)
            if holder is None:
                atomic_write(path, json.dumps(lease_record(lease)).encode())
            return holder

    def _drop_lease(self, lease: Lease) -> None:
        from chatstate.durable.files import locked

        path = self._lease_file(lease.conversation_id)
        with locked(path.with_suffix(".lock")):
            held = self._read_lease(path)  # a damaged lease file is no one's: left as it is
            if isinstance(held, dict) and held.get("owner") == lease.owner:
                path.unlink(missing_ok=True)
