"""The json store: one human-readable JSON file per conversation in a directory.

    DIR/<id>.json             the conversation (header line + one message per line)
    DIR/.partials/<id>.json   the in-progress reply: an append-only log, one fsync per flush
    DIR/.locks/<id>.lock      flock guarding every read-modify-write of <id>
    DIR/.locks/<id>.lease     the writer lease, taken under that flock (_lease)
    DIR/.chatstate/opens.jsonl  boot id / hostname / DEPLOY_ID of every open
    DIR/blobs/<sha256>        images and files named by messages, stored once (_jsonblobs)

An append writes one checksummed record to the end of <id>.json and fsyncs it
(``_log``: one fsync, O(1) at any length). Every other write is temp file (O_EXCL,
unpredictable name) -> fsync -> rename -> fsync directory, under the conversation's
lock: create, set_header, and compaction, which folds the log back into the
document when this process closes the store, when the log outgrows the document,
and when a writer finds a torn last record. A per-process cache of the last
verified file (keyed by inode, mtime and size) spares re-verifying the whole chain
when nobody else has touched it.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import orjson

from chatstate.core.transcript import (
    Conversation,
    ConversationSummary,
    Message,
    now_iso,
    schema_for,
    validate_id,
)
from chatstate.durable.files import (
    TMP_MARK,
    atomic_write,
    ensure_dir,
    fsync_dir,
    locked,
    os_error,
    read_bytes,
    remove_durably,
    sync_durably,
    temp_target,
)
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationNotFound,
    CorruptTranscriptError,
    StoreUnavailable,
)
from chatstate.stores.base import (
    CheckReport,
    Location,
    check_append,
    check_partial_commit,
    check_rewrite,
    local_path,
)
from chatstate.stores.blobs import check_stored_blobs, refuse_unheld_blobs
from chatstate.stores.codec import Take
from chatstate.stores.json import _doc as doc
from chatstate.stores.json._blobs import JsonBlobs
from chatstate.stores.json._lease import JsonLease
from chatstate.stores.json._log import Records, encode_record
from chatstate.stores.json._log_io import append_record, last_summary
from chatstate.stores.json._sealed_rows import sealed_rows
from chatstate.stores.json._sidecar import SidecarLog
from chatstate.stores.leases import Holder, Lease, holder_of, lease_record

# header, message lines, messages, the log part (None: a document alone)
Snapshot = tuple[dict[str, Any], doc.Lines, list[Message], Records | None]


class JsonStore(JsonLease, JsonBlobs):
    """Conversations as JSON files in one directory. See the module docstring."""

    partial_flush_interval = 0.0
    log_limit = 1024 * 1024  # compact once the log is past this and past the document

    def __init__(self, root: Path, url: str | None = None) -> None:
        self.root = root
        self.url = url or f"json://{root}"
        self.recovery: list[str] = []
        self._cache: dict[str, tuple[tuple[int, int, int], Snapshot]] = {}
        self._sidecar = SidecarLog()
        self._logged: set[str] = set()  # conversations this process appended records to

    @classmethod
    def from_url(cls, url: str) -> JsonStore:
        return cls(local_path(url, "json:///abs/dir"), url)

    def location(self) -> Location:
        return Location(url=self.url, path=str(self.root))

    def _file(self, cid: str) -> Path:
        return self.root / f"{validate_id(cid)}.json"

    def _partial(self, cid: str) -> Path:
        return self.root / ".partials" / f"{validate_id(cid)}.json"

    def _lock(self, cid: str) -> Path:
        return self.root / ".locks" / f"{validate_id(cid)}.lock"

    # -- lifecycle -------------------------------------------------------------------
    def open(self) -> None:
        for sub in (self.root, self.root / ".partials", self.root / ".locks",
                    self.root / ".chatstate"):
            ensure_dir(sub)
        try:
            for directory in (self.root, self.root / ".partials"):
                for tmp in sorted(directory.glob(f".*{TMP_MARK}*")):
                    self._remove_stray(tmp)
            self._remove_blob_temps()
            self._remove_lease_temps()
            for partial in sorted((self.root / ".partials").glob("*.json")):
                try:
                    self._reconcile_partial(partial.name[:-5])
                except CorruptTranscriptError as exc:  # reported, left alone, not fatal
                    self.recovery.append(f"could not reconcile: {exc}")
        except OSError as exc:  # the directory listing itself failed (EIO, EMFILE...)
            self.recovery.append(f"recovery skipped: {os_error(exc, 'scan', self.root)}")
        except StoreUnavailable as exc:
            # A read-only or full disk: what is stored must still be readable.
            self.recovery.append(f"recovery skipped, the store cannot be written: {exc}")

    def _remove_stray(self, tmp: Path) -> None:
        target = temp_target(tmp.name)
        if target is None or not target.endswith(".json"):
            return
        cid = target.removesuffix(".json")
        try:
            validate_id(cid)
        except ValueError:
            return
        with locked(self._lock(cid), blocking=False) as got:
            if got:  # no live writer holds it: this temp file is a dead writer's
                remove_durably(tmp)
                self.recovery.append(f"removed {tmp.name}, a temp file left by a killed writer")

    def _reconcile_partial(self, cid: str) -> None:
        path = self._partial(cid)
        with locked(self._lock(cid), blocking=False) as got:
            if not got:
                return
            raw = read_bytes(path)
            if raw is None:
                return
            partial = doc.decode_partial(raw, str(path))
            snap = self._read(cid) if self._file(cid).exists() else None
            last = snap[2][-1].seq if snap and snap[2] else -1
            if snap is None or partial.seq <= last:
                remove_durably(path)
                self.recovery.append(f"{cid}: removed a stale partial reply (seq {partial.seq}) "
                                     "already superseded by the stored transcript")
            else:
                self.recovery.append(f"{cid}: found an interrupted reply (seq {partial.seq}), "
                                     "kept as partial")

    def close(self) -> None:
        for cid in sorted(self._logged):
            try:
                with locked(self._lock(cid)):
                    snap = self._read(cid)
                    if snap[3] is not None:
                        self._compact(cid, snap)
            except ChatstateError as exc:  # damaged, gone, or the disk refuses: left as is
                self.recovery.append(f"{cid}: not compacted at close: {exc}")
        self._logged.clear()
        self._cache.clear()

    # -- reads -----------------------------------------------------------------------
    def _read(self, cid: str) -> Snapshot:
        path = self._file(cid)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise ConversationNotFound(f"no conversation {cid!r} in {self.url}") from None
        except OSError as exc:
            raise os_error(exc, "stat", path) from exc
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = self._cache.get(cid)
        if hit and hit[0] == key:
            return hit[1]
        raw, where = self._raw(cid)
        header, messages, records = doc.decode_file(raw, where)
        if header.get("id", cid) != cid:
            raise CorruptTranscriptError(
                f"{where}: the file holds conversation {header.get('id')!r}, not {cid!r} (a "
                f"copy or a rename by hand?); left as it is. Rename it to "
                f"{header.get('id')}.json, or import it under a new id: chatstate import "
                f"{where} --id NEW_ID")
        logged = len(records.messages) if records is not None else 0
        docraw = raw[:len(raw) - len(records.torn) - records.clean] if records else raw
        snap = (header, doc.Lines(raw=docraw, in_doc=len(messages) - logged,
                                  messages=messages), messages, records)
        self._cache[cid] = (key, snap)
        return snap

    def load(self, conversation_id: str) -> Conversation:
        header, _, messages, _ = self._read(conversation_id)
        partial = self._partial_after(conversation_id, messages[-1].seq + 1 if messages else 0)
        check_stored_blobs(str(self._file(conversation_id)),
                           [*messages, *([partial] if partial else [])],
                           self._blob_size, self._blob_where)
        return doc.to_conversation(header, list(messages), partial)

    def stored_rows(self, conversation_id: str) -> tuple[
            tuple[Any, ...], list[tuple[int, bytes, str]], tuple[int, bytes] | None] | None:
        """The head, every (seq, canonical body, hash) and the partial reply, as stored and
        neither validated nor chain-checked: the encrypted store's fast load
        (``chatstate.stores.sealed``) verifies and opens them itself, as it does the
        relational stores' rows. None when the file is not laid out as written (``load``
        then names what is wrong)."""
        got = self.checked_rows(conversation_id)
        return None if got is None else got[:3]

    def checked_rows(self, conversation_id: str) -> tuple[
            tuple[Any, ...], list[tuple[int, bytes, str]], tuple[int, bytes] | None,
            int] | None:
        """``stored_rows``, and how many rows from the first had their stored chain
        verified as they were read (``doc.checked_rows``): the encrypted store's fast
        load does not hash those again."""
        got = doc.checked_rows(*self._raw(conversation_id))
        if got is None:
            return None
        header, rows, checked = got
        return (self._head_of(header, len(rows), rows[-1][2] if rows else None), rows,
                self._partial_row(conversation_id, len(rows)), checked)

    def sealed_rows(self, conversation_id: str, take: Take
                    ) -> tuple[tuple[Any, ...], tuple[int, bytes] | None] | None:
        """For the encrypted store's load with the key (``sealed``), as sqlite's: every
        message as the binary row it stands for, handed to ``take`` a chunk at a time
        (``_sealed_rows``), then the head and the partial reply. None when a message is
        not one (a record naming blobs), the file is not laid out as written
        (``checked_rows`` then reads it) or ``take`` said stop."""
        got = sealed_rows(*self._raw(conversation_id), take)
        if got is None:
            return None
        header, count, last = got
        return (self._head_of(header, count, last),
                self._partial_row(conversation_id, count))

    @staticmethod
    def _head_of(header: dict[str, Any], count: int, last: str | None) -> tuple[Any, ...]:
        """The head row the encrypted store's fast loads take (the relational stores')."""
        return (header["id"], header["title"], header["created_at"], header["updated_at"],
                orjson.dumps(header["metadata"]), count, last)

    def _raw(self, cid: str) -> tuple[bytes, str]:
        """The conversation file's bytes and its path (as error messages name it)."""
        path = self._file(cid)
        raw = read_bytes(path)
        if raw is None:
            raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
        return raw, str(path)

    def _partial_after(self, cid: str, count: int) -> Message | None:
        """The partial reply that continues ``count`` messages, if any."""
        sidecar = read_bytes(self._partial(cid))
        if sidecar is None:
            return None
        held = doc.decode_partial(sidecar, str(self._partial(cid)))
        return held if held.seq == count else None

    def _partial_row(self, cid: str, count: int) -> tuple[int, bytes] | None:
        """(seq, body) of the partial reply that continues ``count`` messages, if any."""
        held = self._partial_after(cid, count)
        return None if held is None else (held.seq,
                                          held.body().encode("utf-8", "surrogatepass"))

    def blob_sizes(self, digests: list[str]) -> dict[str, int]:
        """Stored sizes of these blobs (absent ones left out)."""
        return {d: size for d in digests if (size := self._blob_size(d)) is not None}

    def list_conversations(self, limit: int | None = None) -> list[ConversationSummary]:
        out = []
        for path in self.root.glob("*.json"):
            try:
                with open(path, "rb") as fh:
                    first = fh.readline().decode("utf-8", "replace")
                # the document's own key ends the first line; metadata may hold the same text
                head = json.loads(first.rsplit(',"messages":[', 1)[0] + "}")
                count, updated = head.get("message_count", 0), head["updated_at"]
                logged = last_summary(path)  # the last log record, if records follow
                if logged is None:
                    _, _, messages, records = self._read(path.name[:-5])
                    logged = ((len(messages), records.updated_at or updated) if records
                              else None)
                if logged != ():
                    count, updated = logged or (count, updated)
                if head["id"] != path.name[:-5]:  # its own id is another file's (a copy)
                    raise ValueError("the file holds another conversation's id")
                out.append(ConversationSummary(
                    id=head["id"], title=head.get("title", ""), created_at=head["created_at"],
                    updated_at=updated, message_count=count))
            except (OSError, ValueError, KeyError, ChatstateError):
                out.append(ConversationSummary(id=path.name[:-5], title="(unreadable: run "
                           "`chatstate doctor`)", created_at="", updated_at="",
                           message_count=0))
        out.sort(key=lambda s: s.updated_at, reverse=True)
        return out[:limit] if limit is not None else out

    # -- writes ----------------------------------------------------------------------
    def _write(self, cid: str, header: dict[str, Any], lines: list[doc.Line],
               messages: list[Message]) -> None:
        path = self._file(cid)
        atomic_write(path, doc.encode(header, lines, schema_for(messages)))
        st = os.stat(path)
        self._cache[cid] = ((st.st_ino, st.st_mtime_ns, st.st_size),
                            (header, doc.Lines(lines), messages, None))

    def _compact(self, cid: str, snap: Snapshot) -> None:
        """Fold the log into the document, atomically; a torn last record is kept aside."""
        header, lines, messages, records = snap
        self._keep_torn(cid, records)
        self._write(cid, header, lines.get(), messages)
        self._logged.discard(cid)

    def _keep_torn(self, cid: str, records: Records | None) -> None:
        """Before a write replaces the file: its torn last record, if any, into
        ``.quarantine/`` and said in ``recovery`` (every rewrite of the file, not only
        compaction, would otherwise drop those bytes unseen)."""
        if records is None or not records.torn:
            return
        qdir = self.root / ".quarantine"
        ensure_dir(qdir)
        aside = qdir / f"{cid}.torn-record.{now_iso().replace(':', '')}"
        atomic_write(aside, records.torn)
        self.recovery.append(
            f"{cid}: a torn last record ({len(records.torn)} bytes, an append a crash cut "
            f"off before it was acknowledged) was moved to {aside}")

    def create(self, conversation: Conversation) -> None:
        cid = conversation.id
        with locked(self._lock(cid)):
            if self._file(cid).exists():
                raise ConflictError(f"conversation {cid!r} already exists in {self.url}")
            self._drop_orphaned_partial(cid)
            self._write(cid, conversation.header(), [], [])

    def _drop_orphaned_partial(self, cid: str) -> None:
        """A partial reply with no transcript is a deleted conversation's (a delete cut
        short by an older version, or a file left behind): a new conversation of the same
        id must not take it for its own interrupted reply."""
        remove_durably(self._partial(cid))

    def _try_create_leased(self, lease: Lease, conversation: Conversation,
                           messages: list[Message]) -> Holder | None:
        """The lease and the conversation with its first messages under one take of the
        conversation's lock: every check first, then the lease file and the document
        (header and messages in one file, as compaction writes it: no log record), each
        written atomically. A document that cannot be written takes the lease back."""
        cid = conversation.id
        path, lease_path = self._file(cid), self._lease_file(cid)
        with locked(self._lock(cid)):
            holder = holder_of(self._read_lease(lease_path), lease)
            if holder is not None:
                return holder
            if path.exists():
                raise ConflictError(f"conversation {cid!r} already exists in {self.url}")
            self._drop_orphaned_partial(cid)
            where = str(path)
            check_append(where, -1, lambda seq: "", messages)
            refuse_unheld_blobs(where, messages, self._blob_size)
            header = conversation.header()
            if messages:
                header["updated_at"] = now_iso()
            atomic_write(lease_path, json.dumps(lease_record(lease)).encode())
            try:
                self._write(cid, header, [doc.line_of(m) for m in messages],
                            list(messages))
            except BaseException:
                with suppress(ChatstateError):  # else it lapses by itself
                    remove_durably(lease_path)
                raise
        return None

    def append(self, conversation_id: str, messages: Sequence[Message], *,
               fence: str | None = None) -> None:
        cid = conversation_id
        with locked(self._lock(cid)):
            self._check_fence(cid, fence)
            snap = self._read(cid)
            header, lines, stored, records = snap
            where = str(self._file(cid))
            already = check_append(where, stored[-1].seq if stored else -1,
                                   lambda seq: stored[seq].hash, messages)
            fresh = list(messages[already:])
            refuse_unheld_blobs(where, fresh, self._blob_size)
            partial_path = self._partial(cid)
            known = self._sidecar.seq_of(partial_path)
            if known is not None and fresh and fresh[0].status != "partial":
                # the partial this process wrote, untouched since: its seq is known without
                # reading a long reply back while another copy of it is being appended
                covered = known <= messages[-1].seq
            else:
                raw = read_bytes(partial_path) if messages else None
                partial = doc.decode_partial(raw, str(partial_path)) if raw is not None \
                    else None
                check_partial_commit(where, fresh, partial)
                covered = partial is not None and partial.seq <= messages[-1].seq
                del raw, partial  # a long partial reply is not held while the append is written
            if fresh:
                if records is not None and records.torn:
                    self._compact(cid, snap)
                    records = None
                self._append_log(cid, header, lines, stored, records, fresh)
            elif already:  # a retry of an append whose outcome was unknown: make it durable
                sync_durably(self._file(cid))
            if covered:
                remove_durably(partial_path)

    def _append_log(self, cid: str, header: dict[str, Any], lines: doc.Lines,
                    stored: list[Message], records: Records | None,
                    fresh: list[Message]) -> None:
        path = self._file(cid)
        if not os.access(self.root, os.W_OK):  # the log could never be compacted: refuse now
            raise os_error(PermissionError(errno.EACCES, "Permission denied"), "write in",
                           self.root)
        at = now_iso()
        new_lines = [doc.line_of(m) for m in fresh]  # a long reply's made as it is written
        schema = schema_for(fresh)
        record = encode_record(at, doc.joined(new_lines, b","), schema)
        key = self._cache[cid][0]
        st = append_record(path, record, key, schema)
        self._logged.add(cid)
        # the cached snapshot's lists grow in place: copying them would make this O(N)
        grown = records if records is not None else Records()
        grown.messages.extend(fresh)
        grown.updated_at = at
        grown.clean += st.st_size - key[2]
        lines.get().extend(new_lines)
        stored.extend(fresh)
        snap = (dict(header, updated_at=at), lines, stored, grown)
        self._cache[cid] = ((st.st_ino, st.st_mtime_ns, st.st_size), snap)
        if grown.clean > max(self.log_limit, st.st_size - grown.clean):
            try:  # the append is durable already: a compaction that fails waits for the next
                self._compact(cid, snap)
            except StoreUnavailable as exc:
                self.recovery.append(f"{cid}: compaction deferred: {exc}")

    def rewrite(self, conversation_id: str, messages: Sequence[Message], *,
                expect: str | None) -> None:
        """The whole document written anew, log folded in, by one atomic rename
        (``Rewrites``: ``chatstate rekey``)."""
        cid = conversation_id
        with locked(self._lock(cid)):
            header, _, stored, records = self._read(cid)
            check_rewrite(str(self._file(cid)), len(stored),
                          stored[-1].hash if stored else None, expect, messages)
            if messages:
                self._keep_torn(cid, records)
                fresh = list(messages)
                self._write(cid, header, [doc.line_of(m) for m in fresh], fresh)
                self._logged.discard(cid)

    def save_partial(self, conversation_id: str, partial: Message, *,
                     fence: str | None = None) -> None:
        with locked(self._lock(conversation_id)):
            self._check_fence(conversation_id, fence)
            _header, _, stored, _ = self._read(conversation_id)
            expected = stored[-1].seq + 1 if stored else 0
            if partial.seq != expected:
                raise ConflictError(f"{self._file(conversation_id)}: partial reply for seq "
                                    f"{partial.seq}, but the next seq is {expected}",
                                    expected_seq=partial.seq - 1, actual_seq=expected - 1)
            record = doc.encode_partial(conversation_id, partial)
            path = self._partial(conversation_id)
            if not isinstance(record, list) or not self._sidecar.append(path, record,
                                                                        partial.seq):
                # a long reply's record, made as it is written, is past the log's limit
                atomic_write(path, record)
                self._sidecar.wrote(path, partial.seq)

    def clear_partial(self, conversation_id: str, *, fence: str | None = None) -> None:
        with locked(self._lock(conversation_id)):
            self._check_fence(conversation_id, fence)
            remove_durably(self._partial(conversation_id))

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None, fence: str | None = None) -> None:
        with locked(self._lock(conversation_id)):
            self._check_fence(conversation_id, fence)
            header, lines, stored, records = self._read(conversation_id)
            self._keep_torn(conversation_id, records)
            changes: dict[str, Any] = {"updated_at": now_iso()}
            if title is not None:
                changes["title"] = title
            if metadata is not None:
                changes["metadata"] = metadata
            self._write(conversation_id, dict(header, **changes), lines.get(), stored)

    def delete(self, conversation_id: str) -> None:
        with locked(self._lock(conversation_id)):
            if not self._file(conversation_id).exists():
                raise ConversationNotFound(f"no conversation {conversation_id!r} in {self.url}")
            # the partial first, as quarantine moves them: a kill between the two leaves
            # the transcript (deleted by a rerun), never a partial a new conversation of
            # the same id would take for its own
            remove_durably(self._partial(conversation_id))
            if not remove_durably(self._file(conversation_id)):
                raise ConversationNotFound(f"no conversation {conversation_id!r} in {self.url}")
            self._cache.pop(conversation_id, None)
            self._logged.discard(conversation_id)

    def quarantine(self, conversation_id: str) -> str:
        """Move a (damaged) conversation aside into DIR/.quarantine/; never deletes."""
        cid = conversation_id
        qdir = self.root / ".quarantine"
        ensure_dir(qdir)
        stamp = now_iso().replace(":", "")
        with locked(self._lock(cid)):
            moved = []
            # the partial first: a kill between the two moves leaves the transcript in
            # place (still loadable, quarantined by a rerun); transcript first would leave
            # an orphaned partial that the next open() removes as stale
            for src in (self._partial(cid), self._file(cid)):
                if src.exists():
                    dst = qdir / f"{src.parent.name}-{src.name}.{stamp}"
                    try:
                        os.rename(src, dst)
                    except OSError as exc:
                        raise os_error(exc, "move to quarantine", src) from exc
                    try:
                        fsync_dir(qdir)
                        fsync_dir(src.parent)
                    except OSError as exc:
                        raise os_error(exc, "fsync the move to quarantine of", src,
                                       outcome=f"It was moved to {dst}, but the move is not "
                                       "known to be on stable storage.") from exc
                    moved.append(dst)
            if not moved:
                raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
            self._cache.pop(cid, None)
            self._logged.discard(cid)
        return str(moved[-1])

    def leftovers(self, conversation_ids: Sequence[str],
                  counts: Mapping[str, int]) -> list[str]:
        """Temp files of these conversations, and their locks still held (ReportsLeftovers)."""
        from chatstate.stores.json._leftovers import json_leftovers

        return json_leftovers(self.root, conversation_ids)

    def forget(self, conversation_ids: Sequence[str]) -> None:
        """Remove the lock files of deleted conversations that no process uses (Forgets)."""
        from chatstate.stores.json._leftovers import json_forget

        json_forget(self.root, conversation_ids)

    # -- bookkeeping -----------------------------------------------------------------
    def record_open(self, record: dict[str, Any]) -> None:
        path = self.root / ".chatstate" / "opens.jsonl"
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        try:
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:  # the new directory entry is durable only once its directory is
                fsync_dir(path.parent)
        except OSError as exc:
            raise os_error(exc, "record this open in", path) from exc

    def opens(self) -> list[dict[str, Any]]:
        raw = read_bytes(self.root / ".chatstate" / "opens.jsonl") or b""
        out = []
        for line in raw.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a torn last line of a killed open: bookkeeping, not a transcript
        return out

    def check(self) -> CheckReport:
        report = CheckReport(ok=False, url=self.url)
        probe = self.root / ".chatstate" / f"probe-{os.getpid()}"
        try:
            atomic_write(probe, b"chatstate probe")
            report.steps.append(f"wrote and fsynced {probe}")
            if read_bytes(probe) != b"chatstate probe":
                raise StoreUnavailable(f"{probe}: read back different bytes")
            report.steps.append("read it back")
            remove_durably(probe)
            report.steps.append("deleted it")
            report.ok = True
        except (ChatstateError, OSError) as exc:
            report.error = str(exc)
        return report
