"""``chatstate rekey`` in place: an encrypted store re-encrypted under a new key.

The run, resumable at every step (each is one atomic write of the store):

1. The encryption mark (``chatstate.stores.sealed``) is rewritten to name the new key
   and the rotation in progress: ``{"key": NEW, "rekey": {"from": OLD, "wrapped":
   [NEW sealed under OLD, OLD sealed under NEW]}}``. From then on a process opening
   the store with either key unwraps the other from the mark, so it reads records
   sealed by both and seals what it writes under the new one.
2. Each conversation holding a record sealed by the old key is rewritten: its
   messages opened (every tag checked) and sealed again under the new key, and the
   stored hash chain over them recomputed, in one atomic ``Rewrites.rewrite`` of the
   store (a compare-and-swap on the stored last hash: a writer that appended since
   makes the rewrite conflict, and it is read and done again; json renames a file,
   sqlite and postgresql commit a transaction, s3 creates one object at the key the
   next append would take). Then its partial
   reply and its title and metadata, each one write. A record already sealed by the
   new key seals to the same bytes again (the nonce is synthetic), so a rerun after
   a kill rewrites only what is left.
3. Passes repeat until one finds nothing under the old key; then the mark names
   only the new key, the wrapped keys are gone, and the old key is refused. A
   conversation that appeared after the last pass and holds records of the old key (a
   writer that opened with only the old key before the rotation) starts the rotation
   again; a rerun of a finished rekey looks for such records before it does nothing.

The plaintext, and so the hashes a caller sees, never change, except for blobs:
a sealed blob's address is a keyed digest (the sha256 of its sealed bytes), named
inside the plaintext of the messages that carry it. A conversation naming a blob
sealed by the old key has each such blob opened and stored again under the new key
(its new address; durable before anything names it), then its messages rewritten,
in the same one atomic ``rewrite``, to name the new addresses: their plaintext chain
hashes change from the first message naming a blob on (a writer holding the old ones
gets a ConflictError and reads the conversation again). A rerun after a kill seals
each blob to the same new address again (its nonce is synthetic too). The old blobs
are left where they are, named by nothing once the rotation is over: ``chatstate gc``
removes them (their ciphertext is under the retired key). A conversation that holds
an interrupted (partial) reply and blobs to re-key is left for a later run (its
partial reply is bound to the chain hash before it, which the rewrite changes, and
the two cannot be swapped in one write): finish the turn, run rekey again.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatstate.core.canonical import chain_hash
from chatstate.core.content import blob_area
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    ConfigurationError,
    ConflictError,
    ConversationInUse,
    ConversationNotFound,
    Unsupported,
)
from chatstate.stores._mark import MARKER_ID, marker
from chatstate.stores.base import Leases, Rewrites, Store
from chatstate.stores.codec import (
    AEAD_NAME,
    BLOB_MAGIC,
    FP_BYTES,
    SEALED_BLOB_PART,
    SEALED_META,
    AeadCodec,
    fingerprint_of,
)


@dataclass
class RekeyReport:
    old: str
    new: str
    conversations: list[str] = field(default_factory=list)
    """Conversations that had a record re-encrypted by this run."""
    records: int = 0
    passes: int = 0
    already_done: bool = False
    blobs: int = 0
    """Blobs sealed again under the new key (the old copies are left for ``gc``)."""

    def to_dict(self) -> dict[str, Any]:
        return {"old_key": self.old, "new_key": self.new, "records": self.records,
                "conversations": self.conversations, "passes": self.passes,
                "already_done": self.already_done, "blobs": self.blobs}


# -- the mark -----------------------------------------------------------------------------
def _wrap(under: bytes, key: bytes) -> str:
    return base64.b64encode(AeadCodec(under).seal("key", MARKER_ID, None, key)).decode()


def rotation_mark(old: bytes, new: bytes) -> dict[str, Any]:
    """The mark's ``encryption`` value while a rotation from ``old`` to ``new`` runs."""
    return {"aead": AEAD_NAME, "format": 1, "key": fingerprint_of(new),
            "rekey": {"from": fingerprint_of(old), "wrapped": [_wrap(old, new), _wrap(new, old)]}}


def rotation_codec(key: bytes, old_keys: Sequence[bytes], mark: dict[str, Any]
                   ) -> AeadCodec | None:
    """For a store whose mark says a rotation is running: the codec sealing under the new
    key and reading both, from either key (the other unwrapped); None otherwise."""
    rot = mark.get("rekey")
    if not isinstance(rot, dict) or not isinstance(rot.get("wrapped"), list):
        return None
    for mine in (key, *old_keys):
        fp = fingerprint_of(mine)
        for wrapped in rot["wrapped"]:
            try:
                raw = base64.b64decode(str(wrapped), validate=True)
            except (binascii.Error, ValueError):
                continue
            if raw[:FP_BYTES].hex() != fp:
                continue
            other = AeadCodec(mine).open("key", MARKER_ID, None, raw,
                                         f"the encryption mark's wrapped key {fp}")
            new, old = (mine, other) if fp == mark.get("key") else (other, mine)
            return AeadCodec(new, older=[old, *old_keys])
    return None


def _fp_of_text(text: object) -> str | None:
    try:
        raw = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw[:FP_BYTES].hex() if len(raw) >= FP_BYTES else None


def record_keys(stored: Conversation) -> dict[str, str | None]:
    """Which key (fingerprint) sealed each record of a conversation as stored:
    ``{"message 0": fp, ..., "partial": fp, "title": fp, "metadata": fp}``."""
    out: dict[str, str | None] = {}
    for msg in stored.messages:
        content = msg.content
        data = content[0].get("data") if isinstance(content, list) and content and \
            isinstance(content[0], dict) else None
        out[f"message {msg.seq}"] = _fp_of_text(data)
    if stored.partial is not None and isinstance(stored.partial.content, list) \
            and stored.partial.content:
        out["partial"] = _fp_of_text(stored.partial.content[0].get("data"))
    out["title"] = _fp_of_text(stored.title)
    out["metadata"] = _fp_of_text(stored.metadata.get(SEALED_META))
    return out


LEASE_WAIT = 120.0
"""Seconds to wait for a live writer's turn (which holds the conversation's lease while it
streams) before rekey stops, to be run again (ConversationInUse)."""


# -- the run ------------------------------------------------------------------------------
def rekey_in_place(inner: Store, old: bytes, new: bytes, *,
                   progress: Callable[[str], None] | None = None,
                   max_passes: int = 5, lease_wait: float = LEASE_WAIT) -> RekeyReport:
    """Re-encrypt ``inner`` (an opened store, as stored: not sealed) from ``old`` to
    ``new`` (see the module docstring). Resumes a run that was killed."""
    from chatstate.stores.sealed import SealedStore

    old_fp, new_fp = fingerprint_of(old), fingerprint_of(new)
    report = RekeyReport(old=old_fp, new=new_fp)
    if old_fp == new_fp:
        raise ConfigurationError("rekey: the new key is the configured key; make a new one "
                                 "with `chatstate keygen`")
    mark = marker(inner)
    if mark is None:
        raise ConfigurationError(f"{inner.url} is not encrypted, so there is nothing to "
                                 "re-encrypt: copy it into a new encrypted store with "
                                 "`chatstate migrate --encrypt`; nothing was changed")
    rot = mark.get("rekey")
    running = isinstance(rot, dict) and rot.get("from") == old_fp and mark.get("key") == new_fp
    finished = mark.get("key") == new_fp and not isinstance(rot, dict)
    if not running and not finished and mark.get("key") != old_fp:
        raise ConfigurationError(
            f"{inner.url} is encrypted by key {mark.get('key')}"
            + (f" (being rotated from {rot.get('from')})" if isinstance(rot, dict) else "")
            + f", not by the configured key {old_fp}; nothing was changed")
    sealed = SealedStore(inner, AeadCodec(new, older=[old]))
    run = _Run(sealed, inner, new_fp, lease_wait)
    if finished and not run.stragglers((), old_fp):
        report.already_done = True  # a rerun after it finished, with nothing left to do
        return report
    if not isinstance(inner, Rewrites):
        raise Unsupported(f"{inner.url}: this store cannot rewrite a conversation in place; "
                          "re-encrypt it into a new store with `chatstate rekey --from URL "
                          "--to NEW_URL`")
    for _ in range(3):
        if not running:  # (again, when a writer holding only the old key wrote after it)
            inner.set_header(MARKER_ID, metadata={"encryption": rotation_mark(old, new)})
            if progress:
                progress(f"rotation started: appends now go under key {new_fp}; key "
                         f"{old_fp} still reads")
        seen = _passes(run, report, progress, max_passes)
        from chatstate.stores._keyed_index import INDEX_ID

        with contextlib.suppress(ConversationNotFound):  # keyed by the old key: made again
            inner.delete(INDEX_ID)                       # by the next search, under the new
        inner.set_header(MARKER_ID, metadata={"encryption": {
            "aead": AEAD_NAME, "format": 1, "key": new_fp}})
        # a conversation created after the last pass listed the store, by a writer that
        # holds only the old key: the rotation goes on for it
        if not run.stragglers(seen, old_fp):
            return report
        running = False
    raise ConflictError(f"{inner.url}: conversations under key {old_fp} kept appearing after "
                        "the rotation (a writer opened before it is still writing under the "
                        "old key): restart it and run rekey again")


def _passes(run: _Run, report: RekeyReport, progress: Callable[[str], None] | None,
            max_passes: int) -> set[str]:
    """Passes over every conversation until one re-encrypts nothing; the ids it saw."""
    from chatstate.stores.sealed import HIDDEN

    for _ in range(max_passes):
        report.passes += 1
        changed = 0
        seen: set[str] = set()
        run.waiting.clear()
        for summary in run.inner.list_conversations():
            if summary.id in HIDDEN:  # the mark; the keyed index is rebuilt by a search
                continue
            seen.add(summary.id)
            n = run.conversation(summary.id)
            if n:
                changed += n
                report.records += n
                if summary.id not in report.conversations:
                    report.conversations.append(summary.id)
                if progress:
                    progress(f"{summary.id}: {n} record(s) re-encrypted")
        if not changed:
            break
    else:
        raise ConflictError(f"{run.inner.url}: records under key {report.old} kept appearing "
                            f"for {max_passes} passes (a writer opened before the rotation is "
                            "still writing under the old key): restart it and run rekey again")
    report.blobs = run.blobs
    if run.waiting:
        raise ConversationInUse(
            f"{run.inner.url}: {', '.join(repr(c) for c in run.waiting)} hold(s) an "
            "interrupted reply and images or files sealed by the old key, which are re-keyed "
            "with a rewrite its partial reply cannot share: finish or retry that turn, then "
            "run rekey again (everything else is re-encrypted; both keys still read)")
    return seen


class _Run:
    """One pass's state: the sealing store, the blob addresses re-keyed so far (old ->
    new), the key each stored blob is sealed by (an address never changes key)."""

    def __init__(self, sealed: Any, inner: Store, new_fp: str, wait: float) -> None:
        self.sealed, self.inner, self.new_fp, self.wait = sealed, inner, new_fp, wait
        self.blob_fps: dict[str, str | None] = {}
        self.moved: dict[str, str] = {}
        self.blobs = 0
        self.waiting: list[str] = []

    def conversation(self, cid: str) -> int:
        """Re-encrypt one conversation's records not under the new key, holding its writer
        lease (where the store has leases), so no turn streams a partial reply meanwhile
        and every write is fenced; how many records were re-encrypted."""
        inner = self.inner
        if not isinstance(inner, Leases):
            return self.records(cid, None)
        try:
            lease = inner.acquire_lease(cid, wait=self.wait)
        except ConversationNotFound:
            return 0
        except ConversationInUse as exc:
            raise ConversationInUse(f"{exc}; its records were not re-encrypted yet: run rekey "
                                    "again once that turn is over (nothing is lost "
                                    "meanwhile)") from None
        try:
            done = self.records(cid, str(lease.owner))
            # s3: the objects an earlier run's rewrite superseded (the old key's records)
            # and its kill left before it removed them
            tidy = getattr(inner, "remove_superseded", None)
            if tidy is not None:
                tidy(cid)
            return done
        finally:
            inner.release_lease(lease)

    def blob_key(self, sha: str) -> str | None:
        """The fingerprint of the key that sealed the stored blob ``sha``."""
        if sha not in self.blob_fps:
            raw = blob_area(self.inner, "images and files").get_blob(sha)
            head = raw[len(BLOB_MAGIC):len(BLOB_MAGIC) + FP_BYTES]
            self.blob_fps[sha] = head.hex() if raw.startswith(BLOB_MAGIC) and \
                len(head) == FP_BYTES else None
        return self.blob_fps[sha]

    def stragglers(self, seen: Collection[str], old_fp: str) -> bool:
        """Does a conversation not in ``seen`` hold a record, or name a blob, sealed by the
        old key?"""
        from chatstate.stores.sealed import HIDDEN

        for summary in self.inner.list_conversations():
            if summary.id in HIDDEN or summary.id in seen:
                continue
            try:
                stored = self.inner.load(summary.id)
            except ConversationNotFound:
                continue
            if old_fp in record_keys(stored).values() or \
                    any(self.blob_key(sha) == old_fp for sha in stored_blobs(stored)):
                return True
        return False

    def stale(self, stored: Conversation) -> tuple[list[str], list[str]]:
        """The records, and the blob addresses named, not under the new key."""
        records = [what for what, fp in record_keys(stored).items()
                   if fp is not None and fp != self.new_fp]
        blobs = [sha for sha in stored_blobs(stored) if self.blob_key(sha) != self.new_fp]
        return records, blobs

    def rekey_blobs(self, shas: Sequence[str]) -> None:
        """Each blob opened (either key) and stored again under the new key, durably,
        before any message names its new address."""
        for sha in shas:
            if sha not in self.moved:
                ref = self.sealed.put_blob(self.sealed.get_blob(sha))
                self.moved[sha] = str(ref["sha256"])
                self.blob_fps[self.moved[sha]] = self.new_fp
                self.blobs += 1

    def records(self, cid: str, fence: str | None, attempts: int = 20) -> int:
        sealed, inner = self.sealed, self.inner
        fenced: dict[str, str] = {} if fence is None else {"fence": fence}
        done = 0
        for _ in range(attempts):
            try:
                stored = inner.load(cid)
            except ConversationNotFound:
                return done  # deleted meanwhile
            stale, blobs = self.stale(stored)
            if not stale and not blobs:
                return done
            if blobs and stored.partial is not None:
                if cid not in self.waiting:
                    self.waiting.append(cid)
                return done
            try:
                opened = sealed.load(cid)  # every tag checked, under either key
                self.rekey_blobs(blobs)
                if blobs or any(w.startswith("message ") for w in stale):
                    again, prev, logical = [], None, None
                    for msg in opened.messages:
                        msg = readdressed(msg, self.moved, logical)
                        again.append(sealed._seal(cid, msg, prev, logical))
                        prev, logical = again[-1].hash, msg.hash
                    inner.rewrite(cid, again, expect=stored.messages[-1].hash)  # type: ignore[attr-defined]
                    stored_last = prev
                else:
                    stored_last = stored.messages[-1].hash if stored.messages else None
                if "partial" in stale and opened.partial is not None:
                    logical = opened.messages[-1].hash if opened.messages else None
                    inner.save_partial(cid, sealed._seal(cid, opened.partial, stored_last,
                                                         logical), **fenced)
                if "title" in stale or "metadata" in stale:
                    inner.set_header(cid, title=sealed._seal_title(cid, opened.title),
                                     metadata=sealed._seal_metadata(cid, opened.metadata),
                                     **fenced)
                done += len(stale) + len(blobs)
            except ConflictError:
                pass  # a writer got there first: read it again
            finally:
                with sealed._lock:
                    sealed._tails.pop(cid, None)
        raise ConflictError(f"{inner.url}: conversation {cid!r} kept changing while it was "
                            "re-encrypted; run rekey again")


def stored_blobs(stored: Conversation) -> list[str]:
    """The blob addresses the stored (sealed) records of a conversation name."""
    found: list[str] = []
    records = [*stored.messages, *([stored.partial] if stored.partial is not None else [])]
    for msg in records:
        if isinstance(msg.content, list):
            for part in msg.content[1:]:
                ref = part.get("blob") if isinstance(part, dict) and \
                    part.get("type") == SEALED_BLOB_PART else None
                sha = ref.get("sha256") if isinstance(ref, dict) else None
                if isinstance(sha, str) and sha not in found:
                    found.append(sha)
    return found


def readdressed(msg: Message, moved: dict[str, str], prev: str | None) -> Message:
    """``msg`` naming each re-keyed blob by its new address, its chain hash recomputed
    from ``prev`` (the plaintext chain hash before it) when that or its body changed."""
    content = msg.content
    if moved and isinstance(content, list) and msg.blob_refs():
        content = [{**part, "blob": {**part["blob"], "sha256": moved.get(
            part["blob"].get("sha256"), part["blob"].get("sha256"))}}
            if isinstance(part.get("blob"), dict) else part for part in content]
        msg = msg.model_copy(update={"content": content})
    again = chain_hash(prev, msg.body())
    return msg if again == msg.hash else msg.model_copy(update={"hash": again})
