"""Writer leases: one live writer per conversation, for a short, renewed term.

A lease is a record (owner token, host, pid, until, and a fresh ``stamp`` per
write) that each store keeps its own way: a row (sqlite, postgresql), a lock file
(json), a conditional object (s3). Taking it succeeds when there is none, when it
is ours, or when it has expired: a writer killed with SIGKILL stops renewing, so
its lease lapses and recovery works after ``term`` seconds; sooner on the same
host, where a holder whose pid is gone is known dead at once. A second writer
waits up to ``wait`` seconds, then gets ``ConversationInUse`` naming the holder's
host and pid.

Expiry is never judged by comparing two writers' wall clocks (``until`` is the
holder's clock, "now" would be the taker's: one clock 120 s ahead and a live lease
was taken). A lease has lapsed when its record has gone unrenewed for a full term
by the taker's own monotonic clock (``unrenewed_for``): unchanged (the same stamp)
for that long while this process watched it, or, written on this very machine
since its last boot (the same boot id), that long ago by the machine's monotonic
clock, which both processes share and no clock step moves. A taker that has not
watched a record from another machine before waits one term for it. A store with
one authoritative clock (a server's) may pass ``now`` on it as well.

Each store implements one step, ``_try_lease(lease) -> holder or None``; this
module holds the waiting and the error, written once. It is public, for stores
written outside chatstate too (see docs/writing-a-store.md).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from chatstate.errors import ConversationInUse, LeaseLost
from chatstate.stores.base import LEASE_TERM, check_append


@cache
def boot_id() -> str:
    """This machine's boot id ('' where the system does not say): two processes with the
    same one share ``time.monotonic()`` (Linux's CLOCK_MONOTONIC counts from boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


@dataclass
class Lease:
    """A held lease. ``until`` is the expiry as the store's clock records it."""

    conversation_id: str
    term: float = LEASE_TERM
    owner: str = field(default_factory=lambda: secrets.token_hex(8))
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    until: float = 0.0
    """The holder's own wall clock at its last write plus ``term``: for people, not expiry."""
    boot: str = field(default_factory=boot_id)
    dead: tuple[str, int] | None = None
    """(host, pid) of a holder found dead on this host: its lease is taken over at once."""


@dataclass
class Holder:
    """Who holds a lease that is not ours."""

    host: str
    pid: int
    until: float
    boot: str = ""
    age: float | None = None
    """Seconds its lease has gone unrenewed by this process's monotonic clock (a lower
    bound: at least as long as this process has watched it), when known."""
    term: float | None = None


def wall_clock() -> float:
    """This host's wall clock, the one seam for it in lease code (tests skew it)."""
    return time.time()


TryLease = Callable[[Lease], "Holder | None"]


def in_use(where: str, cid: str, holder: Holder) -> ConversationInUse:
    if holder.age is not None and holder.term:  # both by this process's monotonic clock
        timing = (f"its lease was renewed {holder.age:.1f} s ago as far as this process has "
                  f"seen, and lapses {holder.term:g} s after its last renewal")
    else:
        timing = "its lease lapses a term after its holder stops renewing it"
    return ConversationInUse(
        f"{where}: conversation {cid!r} is in use by host {holder.host}, pid {holder.pid} "
        f"({timing}); nothing was written. Try again "
        "when it finishes (a dead writer's lease lapses after its term), or wait for it: "
        "Chat(lease_wait=SECONDS), or --lease-wait SECONDS on chatstate ask, chat and serve.",
        host=holder.host, pid=holder.pid, until=holder.until)


def take(where: str, try_lease: TryLease, lease: Lease, wait: float) -> Lease:
    """Take ``lease``, retrying until ``wait`` seconds have passed; raise ConversationInUse."""
    deadline = time.monotonic() + wait
    delay = 0.05
    while True:
        holder = try_lease(lease)
        if holder is None:
            return lease
        if _dead_here(holder):
            lease.dead = (holder.host, holder.pid)
            continue
        if time.monotonic() + delay > deadline:
            raise in_use(where, lease.conversation_id, holder)
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _dead_here(holder: Holder) -> bool:
    """The holder ran on this host, since its last boot, and its process is gone (killed,
    crashed). A record without a boot id (an older chatstate's) goes by the host alone."""
    if holder.host != socket.gethostname() or holder.pid <= 0:
        return False
    if holder.boot and holder.boot != boot_id():  # a pid of another boot, or machine
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, another user's
        return False
    return False


def renew(where: str, try_lease: TryLease, lease: Lease) -> None:
    """Extend a held lease; ConversationInUse if it lapsed and another writer took it."""
    holder = try_lease(lease)
    if holder is not None:
        raise in_use(where, lease.conversation_id, holder)


class LeaseMethods(ABC):
    """``acquire_lease``/``renew_lease``/``release_lease`` (the Leases protocol) on top of a
    store's ``_try_lease(lease) -> Holder | None`` and ``_drop_lease(lease)``."""

    url: str

    @abstractmethod
    def _try_lease(self, lease: Lease) -> Holder | None:
        """Take or extend ``lease``; the current holder when another writer has it."""

    @abstractmethod
    def _drop_lease(self, lease: Lease) -> None:
        """Give ``lease`` up (only if it is still ours)."""

    def acquire_lease(self, conversation_id: str, *, term: float = LEASE_TERM,
                      wait: float = 0.0, owner: str | None = None) -> Lease:
        lease = Lease(conversation_id, term)
        if owner:
            lease.owner = owner
        return take(self.url, self._try_lease, lease, wait)

    def create_leased(self, conversation: Any, messages: Sequence[Any], *,
                      owner: str | None = None, term: float = LEASE_TERM,
                      wait: float = 0.0) -> Lease:
        """The lease, the conversation and its first messages in one write (the
        ``CreatesLeased`` part of the store contract), waiting for a live holder as
        ``acquire_lease`` does."""
        lease = Lease(conversation.id, term)
        if owner:
            lease.owner = owner
        batch = list(messages)
        return take(self.url, lambda held: self._try_create_leased(held, conversation, batch),
                    lease, wait)

    def _try_create_leased(self, lease: Lease, conversation: Any,
                           messages: list[Any]) -> Holder | None:
        """Take ``lease``, create ``conversation`` and append ``messages`` fenced by it, as
        one write; the holder, with nothing written, when another writer has the lease.

        Here the three writes one after another, the lease given back when a later one
        fails (a conversation created before its messages failed stays, empty): a store
        that can make them one transaction overrides it."""
        check_append(self.url, -1, lambda seq: "", messages)  # a broken chain: nothing written
        holder = self._try_lease(lease)
        if holder is not None:
            return holder
        store: Any = self  # a store: create and append are the Store protocol's
        try:
            store.create(conversation)
            if messages:
                store.append(conversation.id, messages, fence=lease.owner)
        except BaseException:
            with suppress(Exception):  # it lapses by itself; the write's error says more
                self._drop_lease(lease)
            raise
        return None

    def renew_lease(self, lease: Lease) -> None:
        renew(self.url, self._try_lease, lease)

    def release_lease(self, lease: Lease) -> None:
        self._drop_lease(lease)


# -- shared by the json, sqlite and s3 leases: the record they keep and who holds it

_seen: dict[str, float] = {}
"""Lease stamps this process wrote or has seen, with the monotonic time it first did."""
_seen_lock = threading.Lock()
_SEEN_MAX = 4096


def _first_seen(stamp: str, now: float) -> float:
    with _seen_lock:
        first = _seen.get(stamp)
        if first is None:
            if len(_seen) >= _SEEN_MAX:  # forgetting one only makes a lease look younger
                for old in list(_seen)[:_SEEN_MAX // 2]:
                    del _seen[old]
            _seen[stamp] = first = now
        return first


def lease_record(lease: Lease, *, now: float | None = None) -> dict[str, Any]:
    """The record to write for ``lease``, renewed now; ``until`` on the store's clock
    ``now`` when it has one it trusts, else on this host's wall clock (for people)."""
    stamp = secrets.token_hex(8)
    mono = time.monotonic()
    _first_seen(stamp, mono)  # written by this process: its age is known exactly
    lease.until = (wall_clock() if now is None else now) + lease.term
    return {"owner": lease.owner, "host": lease.host, "pid": lease.pid, "until": lease.until,
            "stamp": stamp, "boot": lease.boot, "mono": mono, "term": lease.term}


def unrenewed_for(record: dict[str, Any]) -> float:
    """Seconds the lease ``record`` has gone unrenewed, by this process's monotonic clock.

    At least as long as this process has seen the same stamp (the first look counts 0),
    and, for a record written on this machine since its boot, exactly since its write.
    No wall clock enters it, so a clock step neither ages nor refreshes a lease. A
    record of an older chatstate (no stamp) is known by its owner and ``until``.
    """
    now = time.monotonic()
    stamp = record.get("stamp") or f"{record.get('owner')}/{record.get('until')}"
    age = now - _first_seen(str(stamp), now)
    mono, boot = record.get("mono"), record.get("boot")
    if boot and boot == boot_id() and isinstance(mono, int | float):
        age = max(age, now - mono)
    return age


def holder_of(record: Any, lease: Lease, *, now: float | None = None) -> Holder | None:
    """None when ``record`` is free for ``lease`` (absent, unreadable, ours or lapsed).

    Lapsed: unrenewed for its term (``unrenewed_for``); or, when the store passes
    ``now`` on the one clock its records' ``until`` was written by (a server's), past
    ``until``.
    """
    if not isinstance(record, dict) or record.get("owner") == lease.owner:
        return None
    if lease.dead is not None and (record.get("host"), record.get("pid")) == lease.dead:
        return None
    until = record.get("until")
    if not isinstance(until, int | float):
        return None
    if now is not None and until < now:
        return None
    term = record.get("term")
    term = float(term) if isinstance(term, int | float) and term > 0 else lease.term
    age = unrenewed_for(record)
    if age >= term:
        return None
    return Holder(str(record.get("host", "?")), int(record.get("pid", 0)), float(until),
                  boot=str(record.get("boot") or ""), age=age, term=term)


def check_fence(where: str, cid: str, fence: str, record: Any) -> None:
    """Refuse a fenced write unless the lease ``record`` (as stored, None when there is
    none) names ``fence`` as its owner; the caller holds whatever makes this atomic
    with its write. Expiry does not matter: a lapsed lease nobody took is still ours.

    No record at all is refused too: this writer either never held a lease or gave it
    up (release), and a write it cannot prove is its own is not made.
    """
    if isinstance(record, dict) and record.get("owner") == fence:
        return
    if isinstance(record, dict):
        why = (f"another writer (host {record.get('host', '?')}, pid {record.get('pid', '?')}) "
               "took it over after this writer's lease lapsed")
    else:
        why = "this writer holds no lease on it (none is recorded)"
    raise LeaseLost(f"{where}: refused a write to conversation {cid!r}: {why}. Nothing was "
                    "written; this writer must stop (reload to see what the other wrote).",
                    fence=fence)
