"""Copy every conversation, partial reply and open record from one store to another.

``migrate(src, dst)`` is how state moves off an ephemeral box (or between
json, sqlite and s3). It never overwrites: for each conversation it loads both
sides (each load verifies the hash chain) and then

- copies the conversation when the destination has none (header first);
- when the destination's messages are a prefix of the source's, identical by
  hash, appends the rest in batches by compare-and-append: this is also how a
  run killed with SIGKILL resumes, from the destination's last seq;
- skips it when both sides are identical (a rerun copies nothing);
- reports it as a *conflict* when the destination differs (other messages, a
  longer transcript, another title, metadata or partial reply) and leaves it
  exactly as it was.

Blobs (images, files) a copied message names are copied first, read from the
source with their digest checked, unless the destination holds them already.
Open records missing at the destination are appended in the source's order.
With ``verify`` (the default) every copied conversation is reloaded from the
destination and compared, hash by hash, with the source.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationNotFound,
    CorruptTranscriptError,
    StoreUnavailable,
    Unsupported,
)
from chatstate.stores.base import BlobStore, Store
from chatstate.stores.blobs import named_blobs, verify_blobs

Progress = Callable[[str], None]


@dataclass
class MigrateReport:
    """What a migrate did. ``ok`` is False when anything was in conflict or failed."""

    source: str
    destination: str
    copied: list[str] = field(default_factory=list)
    """Conversations created or extended at the destination."""
    skipped: list[str] = field(default_factory=list)
    """Conversations already at the destination, identical."""
    conflicts: dict[str, str] = field(default_factory=dict)
    """Conversation id -> how the destination differs; it was not touched."""
    failed: dict[str, str] = field(default_factory=dict)
    """Conversation id -> the error that stopped its copy (e.g. a corrupt source)."""
    messages_copied: int = 0
    partials_copied: int = 0
    blobs_copied: int = 0
    opens_copied: int = 0

    @property
    def ok(self) -> bool:
        return not self.conflicts and not self.failed

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), ok=self.ok)


class _Differs(Exception):
    """Internal: the destination holds something else under this id."""


def migrate(src: Store, dst: Store, *, verify: bool = True, progress: Progress | None = None,
            batch_size: int = 100) -> MigrateReport:
    """Copy everything from ``src`` to ``dst``; idempotent, resumable, never overwrites.

    Returns a report; conflicts and per-conversation failures are in it, not raised.
    Errors of the stores themselves (``StoreUnavailable``) propagate: rerun to resume.
    """
    report = MigrateReport(source=src.url, destination=dst.url)
    say = progress or (lambda _line: None)
    for cid in sorted(s.id for s in src.list_conversations()):
        try:
            _one(src, dst, cid, report, verify, say, batch_size)
        except _Differs as exc:
            report.conflicts[cid] = str(exc)
            say(f"{cid}: CONFLICT, left untouched at the destination: {exc}")
        except ConflictError as exc:  # a live writer at the destination got in first
            report.conflicts[cid] = f"the destination changed during the copy: {exc}"
            say(f"{cid}: CONFLICT: {exc}")
        except ConversationNotFound:
            continue  # deleted at the source since it was listed
        except StoreUnavailable:
            raise  # nothing is half-written: rerun to resume
        except ChatstateError as exc:  # corrupt source or destination: reported, not touched
            report.failed[cid] = str(exc)
            say(f"{cid}: FAILED: {exc}")
    _copy_opens(src, dst, report, say)
    return report


def copy_conversation(src: Store, dst: Store, cid: str, *, verify: bool = True) -> MigrateReport:
    """Copy one conversation (messages, partial reply, the blobs they name), as migrate does."""
    report = MigrateReport(source=src.url, destination=dst.url)
    _one(src, dst, cid, report, verify, lambda _: None, 500)
    return report


def _one(src: Store, dst: Store, cid: str, report: MigrateReport, verify: bool,
         say: Progress, batch_size: int) -> None:
    conv = src.load(cid)
    if verify and conv.verify() is not None:
        raise CorruptTranscriptError(f"{src.url} conversation {cid!r}: hash chain broken at seq "
                                     f"{conv.verify()}")
    conv, readdressed = _readdress_blobs(src, dst, conv)
    report.blobs_copied += readdressed
    created = False
    try:
        have = dst.load(cid)
    except ConversationNotFound:
        dst.create(Conversation(id=cid, title=conv.title, created_at=conv.created_at,
                                updated_at=conv.updated_at, metadata=conv.metadata))
        have, created = dst.load(cid), True
    _check_prefix(conv, have)
    todo = conv.messages[len(have.messages):]
    for start in range(0, len(todo), batch_size):
        batch = todo[start:start + batch_size]
        report.blobs_copied += _copy_blobs(src, dst, batch)
        dst.append(cid, batch)
        report.messages_copied += len(batch)
        say(f"{cid}: {batch[-1].seq + 1}/{len(conv.messages)} messages")
    partial_done = False
    if conv.partial is not None and have.partial is None:
        report.blobs_copied += _copy_blobs(src, dst, [conv.partial])
        dst.save_partial(cid, conv.partial)
        report.partials_copied += 1
        partial_done = True
    if verify:
        copy = dst.load(cid)
        _check_same(conv, copy)
        verify_blobs(dst, copy)
    if created or todo or partial_done:
        report.copied.append(cid)
        say(f"{cid}: copied {len(todo)} message(s)" + (" and the partial reply"
                                                       if partial_done else ""))
    else:
        report.skipped.append(cid)
        say(f"{cid}: already there, identical")


def _readdress_blobs(src: Store, dst: Store, conv: Conversation) -> tuple[Conversation, int]:
    """``conv`` as the destination names its blobs, and how many blobs that copied.

    Between stores whose blob addresses differ (an encrypted store's are keyed digests:
    plain to encrypted, encrypted to plain, one key to another) the blobs are copied
    first and the references rewritten, which re-seals the chain from the first message
    naming one: the copy's hashes differ from there on (its content does not). Between
    stores that address blobs alike nothing changes. Idempotent, so a rerun resumes.
    """
    named = named_blobs([*conv.messages, *([conv.partial] if conv.partial else [])])
    if not named or not isinstance(src, BlobStore) or not isinstance(dst, BlobStore):
        return conv, 0
    if getattr(src, "codec", None) is None and getattr(dst, "codec", None) is None:
        return conv, 0  # two plain stores address every blob by its sha256
    where: dict[str, str] = {}
    copied = 0
    for sha in named:
        ref = next(r for m in [*conv.messages, *([conv.partial] if conv.partial else [])]
                   for r in m.blob_refs() if r.get("sha256") == sha)
        data = src.get_blob(sha)
        copied += 0 if dst.has_blob(sha) else 1
        where[sha] = str(dst.put_blob(data, media_type=ref.get("media_type"))["sha256"])
    if all(old == new for old, new in where.items()):
        return conv, copied

    def moved(msg: Message, prev: Message | None) -> Message:
        content = msg.content
        if isinstance(content, list):
            content = [{**p, "blob": {**p["blob"], "sha256": where.get(
                p["blob"].get("sha256"), p["blob"].get("sha256"))}}
                       if isinstance(p.get("blob"), dict) else p for p in content]
        draft = msg.model_copy(update={"content": content})
        return draft.model_copy(update={"hash": draft.expected_hash(prev.hash if prev else
                                                                     None)})

    messages: list[Message] = []
    for msg in conv.messages:
        messages.append(moved(msg, messages[-1] if messages else None))
    partial = None if conv.partial is None else \
        moved(conv.partial, messages[-1] if messages else None)
    return conv.model_copy(update={"messages": messages, "partial": partial}), copied


def _copy_blobs(src: Store, dst: Store, messages: list[Message]) -> int:
    """Copy the blobs ``messages`` name that ``dst`` lacks, durably, before they are named."""
    copied = 0
    for sha, _ in named_blobs(messages).items():
        if not isinstance(dst, BlobStore) or not isinstance(src, BlobStore):
            raise Unsupported(f"conversation names blob {sha}, but {src.url} or {dst.url} "
                              "has no blob area")
        if not dst.has_blob(sha):
            ref = next(r for m in messages for r in m.blob_refs() if r.get("sha256") == sha)
            dst.put_blob(src.get_blob(sha), media_type=ref.get("media_type"))
            copied += 1
    return copied


def _check_prefix(conv: Conversation, have: Conversation) -> None:
    """Raise _Differs unless ``have`` is a prefix of ``conv`` that may be completed."""
    if (have.title, have.metadata) != (conv.title, conv.metadata):
        raise _Differs(f"title or metadata differ ({have.title!r} at the destination, "
                       f"{conv.title!r} at the source)")
    if len(have.messages) > len(conv.messages):
        raise _Differs(f"the destination has {len(have.messages)} messages, the source "
                       f"{len(conv.messages)}")
    for mine, theirs in zip(conv.messages, have.messages, strict=False):
        if mine.hash != theirs.hash:
            raise _Differs(f"message seq {mine.seq} differs (hash {theirs.hash[:12]} at the "
                           f"destination, {mine.hash[:12]} at the source)")
    if have.partial is not None:
        if len(have.messages) < len(conv.messages):
            # completing the same turn supersedes its partial, as append() always does
            if conv.messages[len(have.messages)].turn_id != have.partial.turn_id:
                raise _Differs(f"the destination has a partial reply of another turn at seq "
                               f"{have.partial.seq}")
        elif not _same_partial(conv.partial, have.partial):
            raise _Differs(f"the destination has another partial reply at seq "
                           f"{have.partial.seq}")


def _same_partial(a: Message | None, b: Message | None) -> bool:
    # the hash of an unsealed partial is not kept by every store: compare what it covers
    return (a is None) == (b is None) and (a is None or b is None or a.body() == b.body())


def _check_same(conv: Conversation, copy: Conversation) -> None:
    if [m.hash for m in copy.messages] != [m.hash for m in conv.messages]:
        raise CorruptTranscriptError(f"conversation {conv.id!r}: the copy does not verify "
                                     "against the source (different hashes after copying)")
    if not _same_partial(conv.partial, copy.partial):
        raise CorruptTranscriptError(f"conversation {conv.id!r}: the copied partial reply differs")


def _copy_opens(src: Store, dst: Store, report: MigrateReport, say: Progress) -> None:
    def key(record: dict[str, Any]) -> str:
        return json.dumps(record, sort_keys=True, separators=(",", ":"))

    present = {key(r) for r in dst.opens()}
    for record in src.opens():
        if key(record) not in present:
            dst.record_open(record)
            present.add(key(record))
            report.opens_copied += 1
    if report.opens_copied:
        say(f"copied {report.opens_copied} open record(s)")
