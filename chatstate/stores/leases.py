"""Writer leases: one live writer per conversation, for a short, renewed term.

A lease is a record (owner token, host, pid, until) that each store keeps its
own way: a row (sqlite, postgresql), a lock file (json), a conditional object
(s3). Taking it succeeds when there is none, when it is ours, or when it has
expired: a writer killed with SIGKILL stops renewing, so its lease lapses and
recovery works after ``term`` seconds; sooner on the same host, where a holder
whose pid is gone is known dead at once. A second writer waits up to ``wait``
seconds, then gets ``ConversationInUse`` naming the holder's host and pid.

Each store implements one step, ``_try_lease(lease) -> holder or None``; this
module holds the waiting and the error, written once. It is public, for stores
written outside chatstate too (see docs/writing-a-store.md).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chatstate.errors import ConversationInUse, LeaseLost
from chatstate.stores.base import LEASE_TERM


@dataclass
class Lease:
    """A held lease. ``until`` is the expiry as the store's clock records it."""

    conversation_id: str
    term: float = LEASE_TERM
    owner: str = field(default_factory=lambda: secrets.token_hex(8))
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    until: float = 0.0
    dead: tuple[str, int] | None = None
    """(host, pid) of a holder found dead on this host: its lease is taken over at once."""


@dataclass
class Holder:
    """Who holds a lease that is not ours."""

    host: str
    pid: int
    until: float


TryLease = Callable[[Lease], "Holder | None"]


def in_use(where: str, cid: str, holder: Holder) -> ConversationInUse:
    left = max(0.0, holder.until - time.time())
    return ConversationInUse(
        f"{where}: conversation {cid!r} is in use by host {holder.host}, pid {holder.pid} "
        f"(its lease runs {left:.0f} s more unless renewed); nothing was written. Try again "
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
    """The holder ran on this host and its process is gone (killed, crashed)."""
    if holder.host != socket.gethostname() or holder.pid <= 0:
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

    def renew_lease(self, lease: Lease) -> None:
        renew(self.url, self._try_lease, lease)

    def release_lease(self, lease: Lease) -> None:
        self._drop_lease(lease)


# -- shared by the json, sqlite and s3 leases: the record they keep and who holds it

def lease_record(lease: Lease) -> dict[str, Any]:
    lease.until = time.time() + lease.term
    return {"owner": lease.owner, "host": lease.host, "pid": lease.pid, "until": lease.until}


def holder_of(record: Any, lease: Lease) -> Holder | None:
    """None when ``record`` is free for ``lease`` (absent, unreadable, ours or expired)."""
    if not isinstance(record, dict) or record.get("owner") == lease.owner:
        return None
    if lease.dead is not None and (record.get("host"), record.get("pid")) == lease.dead:
        return None
    until = record.get("until")
    if not isinstance(until, int | float) or until < time.time():
        return None
    return Holder(str(record.get("host", "?")), int(record.get("pid", 0)), float(until))


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
