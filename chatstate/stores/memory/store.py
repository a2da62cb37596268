"""The memory store: the store contract's reference implementation, kept in this process.

``memory://NAME`` names one store per process: every open of the same name sees the
same conversations until the process exits, and nothing survives it. So ``location()``
names neither a path nor a remote, and the durability guard refuses the store unless
ephemeral storage is allowed (``allow_ephemeral=True``, ``CHATSTATE_ALLOW_EPHEMERAL=1``
or ``--allow-ephemeral``). ``docs/writing-a-store.md`` walks through this file.

One lock per name makes every method atomic, so a store may be shared by threads (and
by several store objects of one name). A conversation's messages are a tuple that each
write replaces; the tuple last verified is remembered, so a write re-verifies the chain
only when something else changed it, as a file store re-reads a file that changed.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chatstate.core.transcript import (
    Conversation,
    ConversationSummary,
    Message,
    now_iso,
    validate_id,
    verify_chain,
)
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationNotFound,
    CorruptTranscriptError,
    InvalidStoreURL,
    LeaseLost,
)
from chatstate.stores.base import (
    CheckReport,
    Location,
    check_append,
    check_partial_commit,
    check_rewrite,
)
from chatstate.stores.blobs import (
    blob_ref,
    check_stored_blobs,
    checked_blob,
    refuse_damaged_blob,
    refuse_unheld_blobs,
    valid_digest,
)
from chatstate.stores.leases import Holder, Lease, LeaseMethods, holder_of, lease_record

_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass
class Held:
    """One conversation: its header, its chain and its one partial reply."""

    header: dict[str, Any]
    messages: tuple[Message, ...] = ()
    partial: Message | None = None
    verified: tuple[Message, ...] = ()  # ``messages`` as last verified (compared by identity)


@dataclass
class Space:
    """Everything one name holds."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    conversations: dict[str, Held] = field(default_factory=dict)
    blobs: dict[str, tuple[bytes, float]] = field(default_factory=dict)  # (data, stored at)
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    opens: list[dict[str, Any]] = field(default_factory=list)


_SPACES: dict[str, Space] = {}
_SPACES_LOCK = threading.Lock()


class MemoryStore(LeaseMethods):
    """Conversations in this process's memory, under a name. See the module docstring."""

    def __init__(self, name: str, url: str | None = None) -> None:
        self.url = url or f"memory://{name}"
        self.recovery: list[str] = []
        with _SPACES_LOCK:
            self.space = _SPACES.setdefault(name, Space())
        self._lock = self.space.lock

    @classmethod
    def from_url(cls, url: str) -> MemoryStore:
        name = url.split("://", 1)[-1]
        if not _NAME.fullmatch(name):
            raise InvalidStoreURL(f"store URL {url!r}: name the memory store with 1-128 letters, "
                                 "digits, '-', '_' or '.', as in memory://scratch")
        return cls(name, url)

    def location(self) -> Location:
        return Location(url=self.url)  # no path, no remote: the guard calls that ephemeral

    def open(self) -> None:
        """Nothing to create or recover: a killed process takes its memory with it."""

    def close(self) -> None:
        """Nothing to release: the conversations stay for the next open of this name."""

    # -- reads ---------------------------------------------------------------------------
    def _held(self, cid: str) -> Held:
        """The conversation, its chain verified (under the lock)."""
        held = self.space.conversations.get(validate_id(cid))
        if held is None:
            raise ConversationNotFound(f"no conversation {cid!r} in {self.url}")
        if held.verified is not held.messages:
            bad = verify_chain(list(held.messages))
            if bad is not None:
                where = f"{self.url} conversation {cid!r}"
                raise CorruptTranscriptError(f"{where}: message seq {bad} does not chain (its "
                                             "seq or hash is wrong); nothing was changed",
                                             where=where, position=bad)
            held.verified = held.messages
        return held

    def load(self, conversation_id: str) -> Conversation:
        with self._lock:
            held = self._held(conversation_id)
            named = [*held.messages, *([held.partial] if held.partial else [])]
            check_stored_blobs(f"{self.url} conversation {conversation_id!r}", named,
                               self._blob_size, self._blob_where)
            conv = Conversation(**held.header, messages=list(held.messages),
                                partial=held.partial)
        return conv.model_copy(deep=True)  # the caller's copy: editing it changes nothing here

    def list_conversations(self, limit: int | None = None) -> list[ConversationSummary]:
        with self._lock:
            out = [ConversationSummary(message_count=len(held.messages), **{
                k: held.header[k] for k in ("id", "title", "created_at", "updated_at")})
                for held in self.space.conversations.values()]
        out.sort(key=lambda s: s.updated_at, reverse=True)
        return out[:limit]

    # -- writes --------------------------------------------------------------------------
    def _fence(self, cid: str, fence: str | None) -> None:
        """A fenced write must come from the lease's current owner (see base.py)."""
        record = self.space.leases.get(cid)
        if fence is not None and record is not None and record["owner"] != fence:
            raise LeaseLost(f"{self.url}: conversation {cid!r} was taken over by host "
                            f"{record['host']}, pid {record['pid']}; this writer's lease is "
                            "gone, and nothing was written", fence=fence)

    def create(self, conversation: Conversation) -> None:
        cid = validate_id(conversation.id)
        with self._lock:
            if cid in self.space.conversations:
                raise ConflictError(f"conversation {cid!r} already exists in {self.url}")
            self.space.conversations[cid] = Held(copy.deepcopy(conversation.header()))

    def delete(self, conversation_id: str) -> None:
        with self._lock:
            if self.space.conversations.pop(validate_id(conversation_id), None) is None:
                raise ConversationNotFound(f"no conversation {conversation_id!r} in {self.url}")

    def append(self, conversation_id: str, messages: Sequence[Message], *,
               fence: str | None = None) -> None:
        where = f"{self.url} conversation {conversation_id!r}"
        with self._lock:
            held = self._held(conversation_id)
            self._fence(conversation_id, fence)
            stored = held.messages
            already = check_append(where, stored[-1].seq if stored else -1,
                                   lambda seq: stored[seq].hash, messages)
            fresh = [m.model_copy(deep=True) for m in messages[already:]]
            refuse_unheld_blobs(where, fresh, self._blob_size)
            check_partial_commit(where, fresh, held.partial)
            if fresh:
                held.messages = held.verified = (*stored, *fresh)
                held.header["updated_at"] = now_iso()
            if held.partial is not None and messages and held.partial.seq <= messages[-1].seq:
                held.partial = None  # committed in the same step

    def rewrite(self, conversation_id: str, messages: Sequence[Message], *,
                expect: str | None) -> None:
        """Every message replaced at once (``Rewrites``: ``chatstate rekey``)."""
        with self._lock:
            held = self._held(conversation_id)
            stored = held.messages
            check_rewrite(f"{self.url} conversation {conversation_id!r}", len(stored),
                          stored[-1].hash if stored else None, expect, messages)
            if messages:
                held.messages = held.verified = tuple(m.model_copy(deep=True)
                                                      for m in messages)

    def save_partial(self, conversation_id: str, partial: Message, *,
                     fence: str | None = None) -> None:
        with self._lock:
            held = self._held(conversation_id)
            self._fence(conversation_id, fence)
            expected = held.messages[-1].seq + 1 if held.messages else 0
            if partial.seq != expected:
                raise ConflictError(f"{self.url} conversation {conversation_id!r}: partial reply "
                                    f"for seq {partial.seq}, but the next seq is {expected}",
                                    expected_seq=partial.seq - 1, actual_seq=expected - 1)
            held.partial = partial.model_copy(deep=True)

    def clear_partial(self, conversation_id: str, *, fence: str | None = None) -> None:
        with self._lock:
            held = self.space.conversations.get(validate_id(conversation_id))
            self._fence(conversation_id, fence)
            if held is not None:
                held.partial = None

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None, fence: str | None = None) -> None:
        with self._lock:
            held = self._held(conversation_id)
            self._fence(conversation_id, fence)
            held.header["updated_at"] = now_iso()
            if title is not None:
                held.header["title"] = title
            if metadata is not None:
                held.header["metadata"] = copy.deepcopy(metadata)

    # -- leases (the waiting and the errors are _lease's) --------------------------------
    def _try_lease(self, lease: Lease) -> Holder | None:
        with self._lock:
            cid = validate_id(lease.conversation_id)
            holder = holder_of(self.space.leases.get(cid), lease)
            if holder is None:
                self.space.leases[cid] = lease_record(lease)
            return holder

    def _try_create_leased(self, lease: Lease, conversation: Conversation,
                           messages: list[Message]) -> Holder | None:
        """The lease, the header and the first messages under one hold of the lock: every
        check first, then all of it or nothing."""
        cid = validate_id(conversation.id)
        where = f"{self.url} conversation {cid!r}"
        with self._lock:
            holder = holder_of(self.space.leases.get(cid), lease)
            if holder is not None:
                return holder
            if cid in self.space.conversations:
                raise ConflictError(f"conversation {cid!r} already exists in {self.url}")
            check_append(where, -1, lambda seq: "", messages)
            fresh = tuple(m.model_copy(deep=True) for m in messages)
            refuse_unheld_blobs(where, list(fresh), self._blob_size)
            held = Held(copy.deepcopy(conversation.header()))
            if fresh:
                held.messages = held.verified = fresh
                held.header["updated_at"] = now_iso()
            self.space.leases[cid] = lease_record(lease)
            self.space.conversations[cid] = held
            return None

    def _drop_lease(self, lease: Lease) -> None:
        with self._lock:
            if self.space.leases.get(lease.conversation_id, {}).get("owner") == lease.owner:
                del self.space.leases[lease.conversation_id]

    # -- blobs ---------------------------------------------------------------------------
    def _blob_where(self, sha256: str) -> str:
        return f"{self.url} blob {sha256}"

    def _blob_size(self, sha256: str) -> int | None:
        held = self.space.blobs.get(valid_digest(sha256))
        return len(held[0]) if held else None

    def put_blob(self, data: bytes, *, media_type: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        ref = blob_ref(data, media_type, name)
        sha = ref["sha256"]
        with self._lock:
            refuse_damaged_blob(self._blob_where(sha), sha, self._blob_size(sha), len(data))
            kept = self.space.blobs.get(sha, (bytes(data), 0.0))[0]
            self.space.blobs[sha] = (kept, time.time())  # stored again: young for gc
        return ref

    def get_blob(self, sha256: str) -> bytes:
        held = self.space.blobs.get(valid_digest(sha256))
        return checked_blob(self._blob_where(sha256), sha256, held[0] if held else None)

    def has_blob(self, sha256: str) -> bool:
        return self._blob_size(sha256) is not None

    def list_blobs(self) -> list[tuple[str, int, float]]:
        now = time.time()
        with self._lock:
            return [(sha, len(data), now - at) for sha, (data, at) in self.space.blobs.items()]

    def remove_blob(self, sha256: str, *, idle_for: float) -> bool:
        with self._lock:
            held = self.space.blobs.get(valid_digest(sha256))
            if held is None or time.time() - held[1] < idle_for:
                return False
            del self.space.blobs[sha256]
            return True

    # -- bookkeeping ---------------------------------------------------------------------
    def record_open(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.space.opens.append(dict(record))

    def opens(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(record) for record in self.space.opens]

    def check(self) -> CheckReport:
        """A probe blob written, read back and removed: the same path every write takes."""
        report = CheckReport(ok=False, url=self.url)
        try:
            probe = self.put_blob(b"chatstate probe " + str(time.time_ns()).encode())
            report.steps.append(f"wrote probe blob {probe['sha256'][:12]} to {self.url}")
            self.get_blob(probe["sha256"])
            report.steps.append("read it back")
            self.remove_blob(probe["sha256"], idle_for=0.0)
            report.steps.append("deleted it")
            report.ok = True
        except ChatstateError as exc:
            report.error = str(exc)
        return report
