"""Sweep a store's blob area of images and files that no message names any more.

Blobs are stored once per digest and outlive the conversations that named
them: deleting or pruning a conversation leaves its attachments behind (the
same image may be named elsewhere). ``collect_blobs`` removes the blobs that
no stored message or partial reply names and that have not been stored (or
stored again) for ``grace`` seconds; the grace protects a writer that has put a
blob but not yet appended the message naming it. Every conversation is loaded
first, so a damaged one stops the sweep before anything is removed (its
references cannot be known).

A message committed during the sweep is never left without its blob: the
references are read again after the candidates are chosen and just before
anything is removed, and a blob stored (or stored again) after the sweep began
is never removed, whatever the grace (``remove_blob`` checks its age under the
store's own lock). A writer puts its blobs before the message naming them, so
it either renewed the blob after the sweep began or committed in time for the
second reading.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from chatstate.errors import Unsupported
from chatstate.stores.base import CollectsBlobs, Store
from chatstate.stores.blobs import named_blobs

DEFAULT_GRACE = 3600.0
MIN_GRACE = 600.0
"""The shortest grace ``chatstate gc`` takes without --force: a turn puts its blobs,
then waits for the model (minutes with retries and a slow provider) before the
message naming them is stored; ten minutes covers that with room."""


@dataclass
class BlobSweep:
    """What ``collect_blobs`` found and did."""

    held: int = 0
    """Blobs in the store before the sweep."""
    named: int = 0
    """Of those, blobs some message or partial reply names (kept)."""
    removed: list[str] = field(default_factory=list)
    """Digests removed (with ``dry_run``: that would be removed)."""
    young: list[str] = field(default_factory=list)
    """Unnamed, but stored within the grace period (kept)."""
    freed: int = 0
    """Bytes removed (or that would be)."""
    dry_run: bool = False


def collect_blobs(store: Store, *, grace: float = DEFAULT_GRACE,
                  dry_run: bool = False) -> BlobSweep:
    """Remove blobs no message names and nobody stored for ``grace`` seconds."""
    if not isinstance(store, CollectsBlobs):
        raise Unsupported(f"the store {store.url} cannot sweep its blobs")
    began = time.time()
    listed = store.list_blobs()  # before the references: a blob stored later is young
    names = _names(store)
    sweep = BlobSweep(held=len(listed), dry_run=dry_run)
    if not dry_run and any(sha256 not in names and age >= grace
                           for sha256, _, age in listed):
        names |= _names(store)  # again: a message committed during the sweep is seen
    for sha256, size, age in sorted(listed):
        if sha256 in names:
            sweep.named += 1
        elif age < grace:
            sweep.young.append(sha256)
        elif dry_run or store.remove_blob(
                sha256, idle_for=max(grace, time.time() - began)):
            sweep.removed.append(sha256)
            sweep.freed += size
        else:
            sweep.young.append(sha256)  # stored again since it was listed
    return sweep


def _names(store: Store) -> set[str]:
    """Every digest a stored message or partial reply names."""
    names: set[str] = set()
    for summary in store.list_conversations():
        conv = store.load(summary.id)  # a damaged one raises: nothing is removed
        names.update(named_blobs([*conv.messages, *([conv.partial] if conv.partial else [])]))
    return names
