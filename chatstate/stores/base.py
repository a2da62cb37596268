"""The store contract that json, sqlite, s3 and third-party stores all implement.

A store keeps conversations (a header plus a hash-chained list of messages) and
at most one in-progress partial reply per conversation. It knows nothing of
models. Every method that writes returns only once the write is durable
(fsync'd file and directory, committed with synchronous=FULL, or acknowledged
by the object store).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlparse

from chatstate.core.canonical import chain_hash_pieces, long_text
from chatstate.core.content import BlobStore as BlobStore  # below the stores: content uses it
from chatstate.core.transcript import Conversation, ConversationSummary, Message, verify_chain
from chatstate.durable.guard import Report
from chatstate.errors import (
    ConflictError,
    CorruptTranscriptError,
    InvalidStoreURL,
)
from chatstate.stores.blobs import verify_blobs as verify_blobs  # 0.2's documented path


@dataclass
class Location:
    """Where a store's bytes land: a local path (for the durability guard) or a remote.

    Neither means this process's memory (``memory://``): the guard calls it ephemeral.
    """

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
    """A transcript store. Implementations: JsonStore, SqliteStore, S3Store, PostgresStore.

    Optional parts, each its own protocol below, checked with ``isinstance``, so a
    third-party store takes part by defining the methods: ``Quarantines``
    (``chatstate repair``), ``Searchable`` (``chatstate search``; others are scanned),
    ``ReportsLeftovers`` and ``Forgets`` (``chatstate drill``), ``Leases`` (one live
    writer per conversation).

    A store that keeps images and files also implements ``BlobStore`` (every built-in
    store does); one without it can hold only messages that name no blob. Three more
    parts tune what ``open_store`` and ``Chat`` do with a store: ``ReportsDurability``,
    ``OpensReadOnly`` and ``PacesPartials``. What ``open_store`` adds to the store it
    opens is ``OpenedStore`` (a store never defines it). A wrapper forwards through
    ``chatstate.stores.forwarding.ForwardingStore``, which keeps these checks true.

    Threads. Callers may call every method except ``open`` and ``close`` from
    several threads at once, on one conversation or many (``serve`` runs each
    request's store calls in a worker thread, ``AsyncChat`` runs turns in threads),
    so a store must allow that; ``open`` and ``close`` are called with no other call
    in flight. Concurrent writes to one conversation are still decided by
    compare-and-append and the writer lease, exactly as between processes. The
    built-in stores: sqlite serialises every call on its one connection's lock
    (writes share a group commit); json takes the conversation's flock for every
    read-modify-write (a new file description each time, so threads exclude each
    other as processes do) and replaces its per-conversation caches whole;
    postgresql runs each call in one transaction on a connection of its pool; s3
    takes no lock: each call is its own conditional requests, its per-conversation
    caches are replaced whole, and the bookkeeping of a partial reply it streams
    assumes one writer per conversation (the lease). A store that is not
    thread-safe still works where calls come from one thread (the CLI, ``Chat``)
    and in batch, which serialises its calls; not under ``serve``.
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

    def append(self, conversation_id: str, messages: Sequence[Message], *,
               fence: str | None = None) -> None:
        """Compare-and-append sealed messages after the stored last message.

        ``messages[0].seq`` must be the stored last seq + 1 and its hash must chain
        from the stored last hash; otherwise ConflictError and nothing is written.
        Appending messages that are already stored, identical, is a no-op
        (a retry after an "outcome unknown" error never duplicates). Clears the
        partial reply of the same seq in the same atomic step. ``fence``: see below.
        """
        ...

    def save_partial(self, conversation_id: str, partial: Message, *,
                     fence: str | None = None) -> None:
        """Replace the conversation's one in-progress reply (status ``partial``)."""
        ...

    def clear_partial(self, conversation_id: str, *, fence: str | None = None) -> None: ...

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None, fence: str | None = None) -> None:
        """Change the title or metadata (not the messages)."""
        ...

    # Fencing. Every write a turn makes carries ``fence``, the owner token of the
    # writer lease it holds (``Lease.owner``). A store that has leases checks it in
    # the same atomic step as the write: when the conversation's lease record names
    # another owner (another writer took over: this one stalled past its term), the
    # write is refused with LeaseLost and nothing is written. A lease that lapsed but
    # that nobody took is still this writer's. ``fence=None`` is an unfenced write
    # (migrate, import, tools that copy stored state as it is); compare-and-append
    # still applies to it.

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
class Rewrites(Protocol):
    def rewrite(self, conversation_id: str, messages: Sequence[Message], *,
                expect: str | None) -> None:
        """Replace every stored message of a conversation at once (``chatstate rekey``).

        ``messages`` are the same seqs, re-sealed and re-chained; the swap is one atomic
        write, made only while the stored last hash is still ``expect`` (ConflictError
        otherwise: another writer appended since), and refused unless ``messages`` is a
        valid chain of exactly as many messages (``check_rewrite``).
        """
        ...


def check_rewrite(where: str, stored_count: int, stored_last: str | None, expect: str | None,
                  messages: Sequence[Message]) -> None:
    """Decide a ``Rewrites.rewrite`` against what is stored (see it)."""
    if stored_count != len(messages) or stored_last != expect:
        raise ConflictError(f"{where}: changed since it was read for the rewrite (another "
                            "writer appended); nothing was rewritten, read it again",
                            expected_seq=len(messages) - 1, actual_seq=stored_count - 1)
    bad = verify_chain(list(messages), None, 0) if messages else None
    if bad is not None:
        raise CorruptTranscriptError(f"{where}: refusing to rewrite: message seq {bad} does "
                                     "not chain; nothing was rewritten", where=where,
                                     position=bad)


LEASE_TERM = 15.0
"""Seconds a writer lease lasts unless renewed; its holder renews it every third of that."""


@runtime_checkable
class Leases(Protocol):
    """A writer lease per conversation (all built-in stores): one live writer at a time.

    ``Chat`` holds it while a turn persists and streams, renewing it every third of
    its term, so a second writer cannot cut a live stream. See ``chatstate.stores.leases``.
    """

    def acquire_lease(self, conversation_id: str, *, term: float = ...,
                      wait: float = 0.0, owner: str | None = None) -> Any:
        """Take the conversation's lease for ``term`` seconds (a ``Lease``); wait up to
        ``wait`` seconds for a live holder, then raise ConversationInUse naming its
        host and pid. An expired lease (its writer died) is taken over, and so is
        one held under the same ``owner`` token (a writer re-taking its own)."""
        ...

    def renew_lease(self, lease: Any) -> None:
        """Extend a held lease by its term; ConversationInUse if another writer took it."""
        ...

    def release_lease(self, lease: Any) -> None:
        """Give the lease up (a no-op if it is no longer ours)."""
        ...


@runtime_checkable
class CreatesLeased(Protocol):
    """A store that starts a conversation in one step: its writer lease, its header and
    its first messages (every built-in store; ``create_leased`` below composes the
    three calls for any other store). ``chatstate serve`` starts every new
    conversation this way, so a burst of new conversations costs one write each
    before the request goes upstream, not three.
    """

    def create_leased(self, conversation: Conversation, messages: Sequence[Message], *,
                      owner: str | None = None, term: float = ...,
                      wait: float = 0.0) -> Any:
        """Take the lease of ``conversation.id`` (as ``acquire_lease``: ``owner``, ``term``,
        ``wait``), create the conversation from its header and compare-and-append
        ``messages`` (sealed from seq 0; may be empty) under that lease, as one write:
        all of it is durable when it returns (the ``Lease``), or none of it is written.
        ConversationInUse when another live writer holds the lease, ConflictError when
        the id exists already, and what ``append`` raises for the messages."""
        ...


def create_leased(store: Store, conversation: Conversation, messages: Sequence[Message], *,
                  owner: str | None = None, term: float = LEASE_TERM,
                  wait: float = 0.0) -> Any:
    """``store.create_leased`` where the store has it (``CreatesLeased``); else the same
    as three calls: ``acquire_lease`` (a store with ``Leases``; None without), ``create``,
    and ``append`` fenced by the lease. There a failure after the lease was taken gives
    it back, but a conversation created before its messages failed stays (empty), as
    with the separate calls."""
    if isinstance(store, CreatesLeased):
        return store.create_leased(conversation, messages, owner=owner, term=term, wait=wait)
    return compose_create_leased(store, conversation, messages, owner=owner, term=term,
                                 wait=wait)


def compose_create_leased(store: Store, conversation: Conversation,
                          messages: Sequence[Message], *, owner: str | None = None,
                          term: float = LEASE_TERM, wait: float = 0.0) -> Any:
    """``create_leased`` as the three separate calls (see ``create_leased``)."""
    check_append(store.url, -1, lambda seq: "", messages)  # a broken chain: nothing written
    lease = None
    if isinstance(store, Leases):
        lease = store.acquire_lease(conversation.id, term=term, wait=wait, owner=owner)
    try:
        store.create(conversation)
        if messages:
            fence = {"fence": lease.owner} if lease is not None else {}
            store.append(conversation.id, messages, **fence)
    except BaseException:
        if lease is not None and isinstance(store, Leases):
            with suppress(Exception):  # it lapses by itself; the write's error says more
                store.release_lease(lease)
        raise
    return lease


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
class CollectsBlobs(Protocol):
    """A blob area that can be swept of blobs no message names (``chatstate gc``).

    Every blob has an age: seconds since it was stored, or stored again (``put_blob``
    of a digest already held renews it), so a writer about to name an old blob has
    made it young first. ``remove_blob`` checks the age again where it cannot race
    with ``put_blob`` (under the blob lock, or in the DELETE itself).
    """

    def list_blobs(self) -> list[tuple[str, int, float]]:
        """(sha256, size in bytes, age in seconds) of every blob held."""
        ...

    def remove_blob(self, sha256: str, *, idle_for: float) -> bool:
        """Remove the blob if its age is still at least ``idle_for``; whether it was."""
        ...


@runtime_checkable
class Forgets(Protocol):
    def forget(self, conversation_ids: Sequence[str]) -> None:
        """Drop the bookkeeping (e.g. lock files) of deleted conversations no one uses."""
        ...


@runtime_checkable
class ReportsDurability(Protocol):
    """A store on a server that says itself how it acknowledges commits (postgresql).

    The durability guard asks it instead of judging ``location()`` (a local path is
    inspected, any other remote is taken at the service's word).
    """

    def durability_report(self) -> Report:
        """The guard's verdict from the server's settings, before anything is written.

        Raises StoreUnavailable when the server cannot take writes (a standby).
        """
        ...


@runtime_checkable
class OpensReadOnly(Protocol):
    """A store that opens read-only when it cannot write, so what is stored stays readable."""

    read_only_reason: str | None
    """Why ``open()`` fell back to read-only (a full or read-only disk: sqlite), None when
    writable. Every write then raises StoreUnavailable saying so; ``open_store`` records
    no open."""


@runtime_checkable
class PacesPartials(Protocol):
    """A store that says how often a streamed reply's partial should be saved."""

    partial_flush_interval: float
    """Seconds between two saves of a streamed partial reply that suit this store:
    ``Chat``'s default ``flush_interval`` (s3: 0.25, each save is a round trip). A store
    without it gets 0: saves as often as the store keeps up (what arrives during a save
    goes into the next)."""


@runtime_checkable
class OpenedStore(Store, Protocol):
    """A store as ``open_store`` returns it: guarded, opened, its open recorded.

    A store never defines ``guard_report`` itself: ``open_store`` sets it.
    """

    guard_report: Report
    """The durability guard's verdict on the store's location, from before the open."""


def local_path(url: str, example: str) -> Path:
    """The absolute path of a ``json://`` or ``sqlite://`` URL (no I/O)."""
    parsed = urlparse(url)
    path = (parsed.netloc + parsed.path) if parsed.netloc else parsed.path
    if not path.startswith("/"):
        raise InvalidStoreURL(f"store URL {url!r} needs an absolute path: {example}")
    return Path(path)


class PreparedBatch:
    """A batch to append, its bodies encoded and its own chain checked once, before a
    store takes its write lock: that work is in proportion to the batch (seconds for
    200,000 messages) and must not hold other writers back. Only the link of the
    first message to what is stored is left to check under the lock.

    ``pieces``: a store that writes a long reply's body in pieces (sqlite) gets no body
    string for it: its position is in ``pieces`` and its ``bodies`` entry is empty
    (the store writes ``Message.body_pieces``)."""

    def __init__(self, messages: Sequence[Message], *, pieces: bool = False) -> None:
        self.messages = list(messages)
        self.pieces: set[int] = set()
        self.bodies: list[str] = []
        for i, m in enumerate(self.messages):
            if pieces and long_text(m.content):
                self.pieces.add(i)
                self.bodies.append("")
            else:
                self.bodies.append(m.body())
        self.tail_break: int | None = None  # first position past the first that breaks
        for i in range(1, len(self.messages)):
            m, before = self.messages[i], self.messages[i - 1]
            if m.seq != before.seq + 1 or m.hash != self._hash(i, before.hash):
                self.tail_break = before.seq + 1
                break

    def _hash(self, i: int, prev_hash: str | None) -> str:
        if i in self.pieces:
            return chain_hash_pieces(prev_hash, self.messages[i].body_pieces())
        return self.messages[i].hash_after(prev_hash, self.bodies[i])

    def first_break(self, prev_hash: str | None, first: int) -> int | None:
        """Like ``verify_chain(messages, prev_hash, first)``, from the prepared bodies."""
        head = self.messages[0]
        if head.seq != first or head.hash != self._hash(0, prev_hash):
            return first
        return self.tail_break


def check_append(where: str, last_seq: int, hash_at: Callable[[int], str],
                 new: Sequence[Message], prepared: PreparedBatch | None = None) -> int:
    """Decide a compare-and-append against what is stored.

    ``last_seq`` is the stored last seq (-1 when empty) and ``hash_at(seq)`` the
    stored hash at a seq <= last_seq. Returns how many of ``new`` are already
    stored, identical (a retried append), so the caller writes only the rest.
    Raises ConflictError when ``new`` does not continue the stored chain, or
    CorruptTranscriptError when ``new`` is not itself a valid chain. ``prepared``:
    ``new`` prepared before the lock was taken (``PreparedBatch``).
    """
    if not new:
        return 0
    first = new[0].seq
    if first > last_seq + 1:
        raise ConflictError(f"{where}: expected last seq {first - 1}, store has {last_seq}",
                            expected_seq=first - 1, actual_seq=last_seq)
    prev_hash = hash_at(first - 1) if first > 0 else None
    bad = prepared.first_break(prev_hash, first) if prepared is not None else \
        verify_chain(list(new), prev_hash, first)
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
