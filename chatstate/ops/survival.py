"""Survival records: prove that acknowledged writes outlive restarts, reboots and redeploys.

``write(D)`` appends one JSON line to ``D/survival.jsonl``: a sequence number,
the time, boot id, hostname, DEPLOY_ID and a note, plus the sha256 of the
canonical JSON of all of that. It returns only after the file and its
directory are fsync'd, so a record that was reported written must be there
after any crash. ``verify(D)`` re-checks every line's sha256 and that the
sequence numbers run 0, 1, 2 … without a gap, and names every line that
does not.

Appends hold an exclusive flock on the file, so concurrent writers get
distinct sequence numbers. A torn last line (a writer killed before its
record was acknowledged) is never overwritten: the next write starts on a new
line and ``verify`` reports the torn one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from chatstate.durable.files import fsync_dir, write_all
from chatstate.durable.guard import host_identity
from chatstate.errors import SurvivalError, SurvivalFileMissing  # (defined there; old path kept)

__all__ = ["FILE_NAME", "SurvivalError", "SurvivalFileMissing", "Verification", "verify",
           "write"]

FILE_NAME = "survival.jsonl"


def digest(record: dict[str, Any]) -> str:
    """sha256 of a record's canonical JSON, without its own ``sha256`` field."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def write(directory: str | os.PathLike[str], note: str | None = None) -> dict[str, Any]:
    """Append one checksummed record to ``directory/survival.jsonl``; durable on return."""
    root = Path(directory)
    path = root / FILE_NAME
    try:
        _ensure_dir(root)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            existing = _read_fd(fd)
            record: dict[str, Any] = {"seq": _last_seq(existing) + 1,
                                      "time": datetime.now(timezone.utc).isoformat(),
                                      **host_identity(), "pid": os.getpid(), "note": note}
            record["sha256"] = digest(record)
            line = json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n"
            torn = bool(existing) and not existing.endswith(b"\n")
            write_all(fd, (("\n" if torn else "") + line).encode())
            os.fsync(fd)
        finally:
            os.close(fd)  # closing releases the lock
        fsync_dir(root)  # the file's name is durable too, not only its bytes
    except OSError as exc:
        raise SurvivalError(f"could not append a survival record to {path}: "
                            f"{exc.strerror or exc}") from exc
    return record


def _ensure_dir(root: Path) -> None:
    missing = []
    p = root.absolute()
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700)
        fsync_dir(d.parent)


def _read_fd(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _last_seq(raw: bytes) -> int:
    for line in reversed(raw.splitlines()):
        try:
            seq = json.loads(line).get("seq")
        except (ValueError, AttributeError):
            continue
        if isinstance(seq, int):
            return seq
    return -1


@dataclass
class Verification:
    """What ``verify`` found. ``problems`` is empty when every record checks out."""

    path: str
    records: int = 0
    boot_ids: list[str] = field(default_factory=list)
    hostnames: list[str] = field(default_factory=list)
    deploy_ids: list[str] = field(default_factory=list)
    last: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        boots = len(self.boot_ids)
        text = (f"{self.records} record{'s' * (self.records != 1)} from {boots} "
                f"boot{'s' * (boots != 1)}")
        if self.deploy_ids:
            text += f" and {len(self.deploy_ids)} DEPLOY_ID{'s' * (len(self.deploy_ids) != 1)}"
        if self.last is None:
            return text
        last = self.last
        text += (f", last written {last.get('time')} on {last.get('hostname')} (seq "
                 f"{last.get('seq')}, boot {last.get('boot_id')})")
        current = host_identity()["boot_id"]
        if current and last.get("boot_id") and current != last.get("boot_id"):
            text += "; this is a later boot: the file survived a reboot"
        return text


def verify(directory: str | os.PathLike[str]) -> Verification:
    """Check every line's sha256 and seq contiguity; raise SurvivalFileMissing if absent."""
    path = Path(directory) / FILE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SurvivalFileMissing(
            f"no survival file at {path}: it was never written there, or it was lost "
            "(write one with `chatstate survival write --dir DIR`)") from None
    except OSError as exc:
        raise SurvivalError(f"cannot read {path}: {exc.strerror or exc}") from exc
    result = Verification(path=str(path))
    if not raw:
        result.problems.append(f"{path} is empty: the records written there are gone")
    lines = raw.split(b"\n")
    torn_tail = lines[-1] != b""
    expected = 0
    for number, line in enumerate(lines[:-1] if not torn_tail else lines, start=1):
        torn = torn_tail and number == len(lines)
        record, problem = _check_line(line, torn)
        if problem:
            result.problems.append(f"line {number}: {problem}")
        if record is None:
            continue
        if record["seq"] != expected:
            result.problems.append(f"line {number}: seq {record['seq']}, expected {expected} "
                                   "(records missing, duplicated or reordered)")
        expected = record["seq"] + 1
        if problem is None:
            _count(result, record)
    return result


def _check_line(line: bytes, torn: bool) -> tuple[dict[str, Any] | None, str | None]:
    """The record on a line (None if unreadable) and what is wrong with it (None if nothing)."""
    if torn:
        return None, ("torn last line with no newline: a write that was never acknowledged, "
                      "or the file was cut short")
    try:
        record = json.loads(line)
    except ValueError:
        return None, "not valid JSON (damaged or cut short)"
    if not isinstance(record, dict) or not isinstance(record.get("seq"), int):
        return None, "not a survival record (no integer seq)"
    if record.get("sha256") != digest(record):
        return record, (f"sha256 mismatch for seq {record['seq']}: the record was changed "
                        "after it was written")
    return record, None


def _count(result: Verification, record: dict[str, Any]) -> None:
    result.records += 1
    result.last = record
    for key, seen in (("boot_id", result.boot_ids), ("hostname", result.hostnames),
                      ("deploy_id", result.deploy_ids)):
        value = record.get(key)
        if isinstance(value, str) and value not in seen:
            seen.append(value)
