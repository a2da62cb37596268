"""The json store's writer lease: ``DIR/.locks/<id>.lease``.

A small JSON file rewritten atomically under the conversation's flock. The flock
alone would not do: it dies with its holder at once, while a lease must outlive a
short stall and lapse only after its term.
"""

from __future__ import annotations

import json
from pathlib import Path

from chatstate.core.transcript import validate_id
from chatstate.stores._lease import Holder, Lease, LeaseMethods, holder_of, lease_record


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

    def _try_lease(self, lease: Lease) -> Holder | None:
        from chatstate.durable.files import atomic_write, locked, read_bytes

        path = self._lease_file(lease.conversation_id)
        with locked(path.with_suffix(".lock")):
            raw = read_bytes(path)
            try:
                held = json.loads(raw) if raw else None
            except ValueError:
                held = None  # a torn lease is no lease: the atomic write makes that rare
            holder = holder_of(held, lease)
            if holder is None:
                atomic_write(path, json.dumps(lease_record(lease)).encode())
            return holder

    def _drop_lease(self, lease: Lease) -> None:
        from chatstate.durable.files import locked, read_bytes

        path = self._lease_file(lease.conversation_id)
        with locked(path.with_suffix(".lock")):
            raw = read_bytes(path)
            if raw and json.loads(raw).get("owner") == lease.owner:
                path.unlink(missing_ok=True)
