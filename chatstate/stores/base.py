"""The store contract that json, sqlite, s3 and third-party stores all implement.

A store keeps conversations (a header plus a hash-chained list of messages) and
at most one in-progress partial reply per conversation. It knows nothing of
models. Every method that writes returns only once the write is durable
(fsync'd file and directory, committed with synchronous=FULL, or acknowledged
by the object store).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlparse

from ..errors import ChatstateError, ConflictError, CorruptTranscriptError
from ..transcript import Conversation, ConversationSummary, Message, verify_chain


@dataclass
class Location:
    """Where a store's bytes land: a local path (for the durability guard) or a remote."""

    url: str
    path: str | None = None
    remote: str | None = None


@dataclass
class CheckReport:
    """Readiness of a store: a real probe write, read back and delete."""

    ok: bool
    url: str
    steps: list[str] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Store(Protocol):
    """A transcript store. Implementations: JsonStore, SqliteStore, S3Store.

    Optional parts, each its own protocol below, checked with ``isinstance``, so a
    third-party store takes part by defining the methods: ``Quarantines``
    (``chatstate repair``), ``Searchable`` (``chatstate search``; others are scanned),
    ``ReportsLeftovers`` and ``Forgets`` (``chatstate drill``).
    """

    url: str
    recovery: list[str]
    """What ``open()`` found and reconciled (stray temp files, stale partials)."""

    @classmethod
    def from_url(cls, url: str) -> Store:
        """Parse the URL. Does no I/O: the durability guard runs before anything is written."""
        ...

    def location(self) -> Location:
        """Where the bytes land, for the durability guard. No I/O."""
        ...

    def open(self) -> None:
        """Create what is missing, migrate, and recover what a killed writer left behind."""
        ...

    def close(self) -> None: ...

    def create(self, conversation: Conversation) -> None:
        """Create an empty conversation from its header (messages must be empty).

        Raises ConflictError if the id exists already.
        """
        ...

    def load(self, conversation_id: str) -> Conversation:
        """The conversation with all messages and its partial reply, chain verified.

        Raises ConversationNotFound, or CorruptTranscriptError naming the file/key
        and the position (the damaged data is left untouched).
        """
        ...

    def list_conversations(self, limit: int | None = None) -> list[ConversationSummary]:
        """Summaries, most recently updated first. An empty store gives []."""
        ...

    def delete(self, conversation_id: str) -> None:
        """Remove a conversation and its partial. ConversationNotFound if absent."""
        ...

    def append(self, conversation_id: str, messages: Sequence[Message]) -> None:
        """Compare-and-append sealed messages after the stored last message.

        ``messages[0].seq`` must be the stored last seq + 1 and its hash must chain
        from the stored last hash; otherwise ConflictError and nothing is written.
        Appending messages that are already stored, identical, is a no-op
        (a retry after an "outcome unknown" error never duplicates). Clears the
        partial reply of the same seq in the same atomic step.
        """
        ...

    def save_partial(self, conversation_id: str, partial: Message) -> None:
        """Replace the conversation's one in-progress reply (status ``partial``)."""
        ...

    def clear_partial(self, conversation_id: str) -> None: ...

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None) -> None:
        """Change the title or metadata (not the messages)."""
        ...

    def record_open(self, record: dict[str, Any]) -> None:
        """Remember boot id, hostname, DEPLOY_ID and time of this open."""
        ...

    def opens(self) -> list[dict[str, Any]]:
        """Every open ever recorded, oldest first."""
        ...

    def check(self) -> CheckReport:
        """Write, read back and delete a probe in the real store. Never raises."""
        ...


@runtime_checkable
class Quarantines(Protocol):
    def quarantine(self, conversation_id: str) -> str:
        """Move a (damaged) conversation aside, never deleting; return where it went.

        Parses nothing (the data may be damaged). ConversationNotFound if absent.
        """
        ...


@runtime_checkable
class Searchable(Protocol):
    def search(self, text: str, limit: int = 50) -> list[tuple[str, int, str]]:
        """(conversation id, seq, content) of stored messages containing ``text``."""
        ...


@runtime_checkable
class ReportsLeftovers(Protocol):
    def leftovers(self, conversation_ids: Sequence[str],
                  counts: Mapping[str, int]) -> list[str]:
        """What killed writers left that ``open()`` did not recover, for these conversations.

        Stray temp files, locks still held, objects outside the layout or beyond
        ``counts`` (the stored message count per conversation): one sentence per
        problem, [] when clean. Reads only.
        """
        ...


@runtime_checkable
class Forgets(Protocol):
    def forget(self, conversation_ids: Sequence[str]) -> None:
        """Drop the bookkeeping (e.g. lock files) of deleted conversations no one uses."""
        ...


def local_path(url: str, example: str) -> Path:
    """The absolute path of a ``json://`` or ``sqlite://`` URL (no I/O)."""
    parsed = urlparse(url)
    path = (parsed.netloc + parsed.path) if parsed.netloc else parsed.path
    if not path.startswith("/"):
        raise ChatstateError(f"store URL {url!r} needs an absolute path: {example}")
    return Path(path)


def check_append(where: str, last_seq: int, hash_at: Callable[[int], str],
                 new: Sequence[Message]) -> int:
    """Decide a compare-and-append against what is stored.

    ``last_seq`` is the stored last seq (-1 when empty) and ``hash_at(seq)`` the
    stored hash at a seq <= last_seq. Returns how many of ``new`` are already
    stored, identical (a retried append), so the caller writes only the rest.
    Raises ConflictError when ``new`` does not continue the stored chain, or
    CorruptTranscriptError when ``new`` is not itself a valid chain.
    """
    if not new:
        return 0
    first = new[0].seq
    if first > last_seq + 1:
        raise ConflictError(f"{where}: expected last seq {first - 1}, store has {last_seq}",
                            expected_seq=first - 1, actual_seq=last_seq)
    prev_hash = hash_at(first - 1) if first > 0 else None
    bad = verify_chain(list(new), prev_hash, first)
    if bad is not None:
        if first > 0 and bad == first:  # new[0] was sealed after another last message
            raise ConflictError(
                f"{where}: seq {first} does not chain from the stored seq {first - 1}: "
                "another writer got there first; reload and retry",
                expected_seq=first - 1, actual_seq=last_seq)
        raise CorruptTranscriptError(
            f"{where}: refusing to append: message seq {bad} does not chain (wrong seq or "
            "hash); seal messages with Message.seal()", where=where, position=bad)
    already = 0
    for msg in new:
        if msg.seq > last_seq:
            break
        if hash_at(msg.seq) != msg.hash:
            raise ConflictError(
                f"{where}: another writer appended seq {msg.seq} first (store is at "
                f"seq {last_seq}); reload and retry", expected_seq=first - 1,
                actual_seq=last_seq)
        already += 1
    return already


def check_partial_commit(where: str, fresh: Sequence[Message], stored: Message | None) -> None:
    """Keeping a partial reply in the chain must keep the one the store holds now.

    A live writer may have streamed (and shown) more since the caller loaded it;
    committing the older copy would clear the newer partial and lose that text.
    """
    if fresh and fresh[0].status == "partial" and stored is not None and \
            stored.seq == fresh[0].seq and stored.hash != fresh[0].hash:
        raise ConflictError(f"{where}: the partial reply at seq {stored.seq} changed since it "
                            "was loaded (another writer is still streaming it); reload and "
                            "retry", expected_seq=fresh[0].seq - 1, actual_seq=fresh[0].seq - 1)
