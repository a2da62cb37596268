"""Outputs on shared storage: ``s3://bucket/prefix?endpoint_url=…``, one object per record.

Every output is written create-only (``If-None-Match: *``), so an output,
once it exists, is never overwritten or duplicated: a worker that lost its
lease and finishes late has its write refused, whoever wrote first. Keys are
the same names as in an output directory (``outputs.output_name``); keys under
``.quarantine/`` are chatstate's own. There are no temp objects: a put lands
whole or not at all. Errors are translated once, in ``_s3io``.
"""

from __future__ import annotations

from chatstate.batch.outputs import QUARANTINE, Scan, Written, sha256_hex
from chatstate.errors import MissingExtra, StoreUnavailable


def is_url(value: str) -> bool:
    return value.startswith("s3://")


class S3Outputs:
    shared = True

    def __init__(self, url: str) -> None:
        try:
            from chatstate.stores.s3.client import S3IO, parse_url
        except ImportError as exc:
            raise MissingExtra("s3:// outputs need obstore: pip install "
                               "'chatstate[s3]'", extra="s3") from exc
        self._io = S3IO(parse_url(url))
        self.where = self._io.target.where("")

    def prepare(self) -> None:
        """Nothing to create; the bucket must exist (a missing one is a clear error on use)."""

    def scan(self) -> Scan:
        found = Scan()
        for key, _ in self._io.keys(""):
            if not key.startswith(".") and "/" not in key:
                found.files.add(key)
        return found

    def sha256(self, rel: str) -> str | None:
        blob = self._io.get(rel)
        return None if blob is None else sha256_hex(blob.data)

    def quarantine(self, rel: str) -> str:
        """Copy to ``.quarantine/`` (create-only, numbered on a clash), then remove the original."""
        from chatstate.stores.s3.client import Exists

        blob = self._io.get(rel, action="quarantine")
        if blob is None:
            raise StoreUnavailable(f"cannot quarantine {self._io.target.where(rel)}: it is gone")
        for n in range(10_000):
            dest = f"{QUARANTINE}/{rel}" + (f".{n}" if n else "")
            try:
                self._io.put(dest, blob.data, create=True, action="quarantine")
            except Exists:
                continue
            self._io.delete([rel], action="quarantine")
            return dest
        raise StoreUnavailable(f"too many quarantined copies of {self._io.target.where(rel)}")

    def remove_temp(self, rel: str) -> bool:
        return False  # no temp objects on S3

    def write(self, rel: str, data: bytes) -> Written:
        from chatstate.stores.s3.client import Exists

        try:
            self._io.put(rel, data, create=True)
        except Exists:
            return Written(taken=self.sha256(rel) or "")
        return Written()
