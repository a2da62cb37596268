"""Writer leases of the json, sqlite and s3 stores (the postgresql one is ``_pg_lease``).

- json: ``DIR/.locks/<id>.lease``, a small JSON file rewritten atomically under the
  conversation's flock. The flock alone would not do: it dies with its holder at
  once, while a lease must outlive a short stall and lapse only after its term.
- sqlite: a ``leases`` row (migration ``m006_leases``), taken by one upsert.
- s3: ``_leases/<id>.json``, created with If-None-Match and replaced with If-Match,
  so two hosts cannot both take it. Expiry is judged by the writers' clocks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..transcript import validate_id
from ._lease import Holder, Lease, LeaseMethods
from ._sqlite_conn import SqliteConnection


def _record(lease: Lease) -> dict[str, Any]:
    lease.until = time.time() + lease.term
    return {"owner": lease.owner, "host": lease.host, "pid": lease.pid, "until": lease.until}


def _holder(record: Any, lease: Lease) -> Holder | None:
    """None when ``record`` is free for ``lease`` (absent, unreadable, ours or expired)."""
    if not isinstance(record, dict) or record.get("owner") == lease.owner:
        return None
    if lease.dead is not None and (record.get("host"), record.get("pid")) == lease.dead:
        return None
    until = record.get("until")
    if not isinstance(until, int | float) or until < time.time():
        return None
    return Holder(str(record.get("host", "?")), int(record.get("pid", 0)), float(until))


class JsonLease(LeaseMethods):
    root: Path
    recovery: list[str]

    def _remove_lease_temps(self) -> None:
        """Temp files of lease writes a killed writer left in ``.locks`` (on open)."""
        from ._files import TMP_MARK, locked, remove_durably, temp_target

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
        from ._files import atomic_write, locked, read_bytes

        path = self._lease_file(lease.conversation_id)
        with locked(path.with_suffix(".lock")):
            raw = read_bytes(path)
            try:
                held = json.loads(raw) if raw else None
            except ValueError:
                held = None  # a torn lease is no lease: the atomic write makes that rare
            holder = _holder(held, lease)
            if holder is None:
                atomic_write(path, json.dumps(_record(lease)).encode())
            return holder

    def _drop_lease(self, lease: Lease) -> None:
        from ._files import locked, read_bytes

        path = self._lease_file(lease.conversation_id)
        with locked(path.with_suffix(".lock")):
            raw = read_bytes(path)
            if raw and json.loads(raw).get("owner") == lease.owner:
                path.unlink(missing_ok=True)


class SqliteLease(LeaseMethods, SqliteConnection):
    def _try_lease(self, lease: Lease) -> Holder | None:
        rec = _record(lease)
        with self._tx("take the writer lease in") as db:
            taken = db.execute(
                "INSERT INTO leases AS l (conversation_id, owner, host, pid, until) VALUES "
                "(?, ?, ?, ?, ?) ON CONFLICT (conversation_id) DO UPDATE SET "
                "owner=excluded.owner, host=excluded.host, pid=excluded.pid, "
                "until=excluded.until WHERE l.owner=excluded.owner OR l.until < ? "
                "OR (l.host=? AND l.pid=?)",
                (validate_id(lease.conversation_id), lease.owner, lease.host, lease.pid,
                 rec["until"], time.time(), *(lease.dead or ("", -1)))).rowcount
            if taken:
                return None
            row = db.execute("SELECT host, pid, until FROM leases WHERE conversation_id=?",
                             (lease.conversation_id,)).fetchone()
        return Holder(row[0], row[1], row[2])

    def _drop_lease(self, lease: Lease) -> None:
        with self._tx("release the writer lease in") as db:
            db.execute("DELETE FROM leases WHERE conversation_id=? AND owner=?",
                       (lease.conversation_id, lease.owner))


class S3Lease(LeaseMethods):
    io: Any

    def _try_lease(self, lease: Lease) -> Holder | None:
        from ._s3io import Exists, Stale

        key = f"_leases/{validate_id(lease.conversation_id)}.json"
        blob = self.io.get(key, "read the writer lease of")
        if blob is not None:
            try:
                held = json.loads(blob.data)
            except ValueError:
                held = None
            holder = _holder(held, lease)
            if holder is not None:
                return holder
        data = json.dumps(_record(lease)).encode()
        try:
            self.io.put(key, data, create=blob is None, etag=blob.etag if blob else None,
                        action="take the writer lease of")
        except (Exists, Stale):  # another writer took it between our read and our write
            return self._try_lease(lease)
        return None

    def _drop_lease(self, lease: Lease) -> None:
        key = f"_leases/{validate_id(lease.conversation_id)}.json"
        blob = self.io.get(key, "read the writer lease of")
        if blob is not None and json.loads(blob.data).get("owner") == lease.owner:
            self.io.delete([key], "release the writer lease of")
