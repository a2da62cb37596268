"""The blob area's checks, shared by every store that has one (``BlobStore``).

A blob is immutable and named by the sha256 of its bytes. These helpers make the
reference a message carries, refuse a digest that is not one, check bytes against
their digest, and refuse an append or a load whose named blobs are missing or the
wrong size; each error names the file or key and leaves the data as it is.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from chatstate.core.content import BlobStore
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import CorruptTranscriptError, InvalidInput

if TYPE_CHECKING:
    from chatstate.stores.base import Store

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def blob_ref(data: bytes, media_type: str | None = None, name: str | None = None
             ) -> dict[str, Any]:
    """The reference a message part carries for ``data``."""
    ref: dict[str, Any] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    if media_type:
        ref["media_type"] = media_type
    if name:
        ref["name"] = name
    return ref


def valid_digest(sha256: object) -> str:
    """``sha256`` if it is 64 lowercase hex digits (safe as a file name and key), else raise."""
    if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
        raise InvalidInput(f"invalid blob digest {str(sha256)[:80]!r}: expected 64 lowercase "
                           "hex digits (a sha256)")
    return sha256


def checked_blob(where: str, sha256: str, data: bytes | None) -> bytes:
    """``data`` if it is there and matches ``sha256``, else CorruptTranscriptError naming where."""
    if data is None:
        raise CorruptTranscriptError(
            f"{where}: blob {sha256} is missing; a message names it. Restore it from a backup "
            "(nothing was changed).", where=where)
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise CorruptTranscriptError(
            f"{where}: blob {sha256} was altered: its {len(data)} bytes hash to {actual[:16]}…; "
            "restore it from a backup (nothing was changed).", where=where)
    return data


def refuse_damaged_blob(where: str, sha256: str, held: int | None, size: int) -> None:
    """``put_blob`` found this digest stored with another size: damaged, never overwritten."""
    if held is not None and held != size:
        raise CorruptTranscriptError(
            f"{where}: blob {sha256} is stored with {held} bytes, not {size}: it was damaged. "
            "It was left as it is; move it aside (or restore it) and store the bytes again.",
            where=where)


def named_blobs(messages: Sequence[Message]) -> dict[str, tuple[int, int]]:
    """digest -> (size, seq of the first message naming it), for blob checks."""
    out: dict[str, tuple[int, int]] = {}
    if set(map(type, map(attrgetter("content"), messages))) <= {str}:
        return out  # the common case, in one C loop: no parts, no blobs
    for msg in messages:
        if isinstance(msg.content, str):
            continue
        for ref in msg.blob_refs():
            sha = ref.get("sha256")
            if isinstance(sha, str) and sha not in out:
                size = ref.get("size")
                out[sha] = (size if isinstance(size, int) else -1, msg.seq)
    return out


def refuse_unheld_blobs(where: str, messages: Sequence[Message],
                        size_of: Callable[[str], int | None]) -> None:
    """Before an append: every blob the messages name must be stored, with its size.

    ``size_of(sha256)`` is the stored blob's size, None when absent.
    """
    for sha, (size, seq) in named_blobs(messages).items():
        valid_digest(sha)
        held = size_of(sha)
        if held is None or held != size:
            problem = "which this store does not hold" if held is None else \
                f"of {size} bytes, but the stored blob has {held}"
            raise InvalidInput(
                f"{where}: refusing to append: message seq {seq} names blob {sha} {problem}. "
                "Store the bytes first with put_blob() (chatstate.core.content does this when "
                "sending); nothing was written.")


def check_stored_blobs(where: str, messages: Sequence[Message],
                       size_of: Callable[[str], int | None],
                       blob_where: Callable[[str], str]) -> None:
    """On load: every named blob exists with the size its reference records.

    The digest itself is checked whenever the bytes are read (``get_blob``) and by
    ``verify_blobs``; load stays O(number of blobs), not O(their bytes).
    """
    for sha, (size, seq) in named_blobs(messages).items():
        held = size_of(sha) if _SHA256_RE.fullmatch(sha) else None
        if held is None or held != size:
            what = "is missing" if held is None else f"has {held} bytes, not {size}"
            raise CorruptTranscriptError(
                f"{blob_where(sha)}: the blob named by message seq {seq} of {where} {what}; "
                "nothing was changed. Restore the blob from a backup.",
                where=blob_where(sha), position=seq)


def verify_blobs(store: Store, conversation: Conversation) -> int:
    """Read every blob the conversation names and check its digest; return how many.

    Raises CorruptTranscriptError naming the blob's file/key. A store without a
    blob area holds no blobs: any reference in it is reported as missing.
    """
    messages = list(conversation.messages)
    if conversation.partial is not None:
        messages.append(conversation.partial)
    blobs = named_blobs(messages)
    if not blobs:
        return 0
    if not isinstance(store, BlobStore):
        raise CorruptTranscriptError(f"{store.url}: conversation {conversation.id!r} names "
                                     "blobs, but this store has no blob area")
    for sha in blobs:
        store.get_blob(sha)
    return len(blobs)
