"""The s3 store's in-place rewrite (what ``chatstate rekey`` needs): one create-only PUT of a
rewrite segment at the slot the next append would take; what it superseded is removed
after it, and the states a kill or a racing reader can meet in between still read as the
rewritten chain.

Against the real moto server on loopback (its conditional writes made atomic:
support/moto_atomic.py); the optional ``RewriteCases`` run on moto and SeaweedFS in
test_store_contract.py and test_s3_seaweed.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.s3server import moto_endpoint, new_bucket_url, object_keys, read_object, write_object

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ConflictError, CorruptTranscriptError
from chatstate.stores import open_store
from chatstate.testing.store_contract import seal_chain

__all__ = ["moto_endpoint"]  # the fixture, re-exported so pytest finds it here

CID = "c1"
SNAP = "conversations/c1/snap/0000000063.json"
INDEX = "index/c1.json"


@pytest.fixture
def url(moto_endpoint: str) -> str:
    return new_bucket_url(moto_endpoint)


def _seventy(url: str) -> tuple[Any, list[Message]]:
    """c1 with 70 messages, one append each (segments m/0..m/69 and a snapshot at 63)."""
    store = open_store(url)
    store.create(Conversation(id=CID, title="t"))
    msgs = seal_chain(70, prefix="old")
    for msg in msgs:
        store.append(CID, [msg])
    assert SNAP in object_keys(url)
    return store, msgs


def test_a_rewrite_takes_the_next_slot_and_removes_what_it_superseded(url: str) -> None:
    store, msgs = _seventy(url)
    again = seal_chain(70, prefix="new")
    store.rewrite(CID, again, expect=msgs[-1].hash)
    keys = object_keys(url)
    assert [k for k in keys if "/m/" in k or "/snap/" in k] == \
        ["conversations/c1/m/0000000070.json"]  # the rewrite segment, nothing before it
    assert json.loads(read_object(url, INDEX) or b"")["shift"] == 1
    fresh = open_store(url)
    try:
        assert fresh.load(CID).messages == again
        more = seal_chain(1, again[-1])
        fresh.append(CID, more)  # seq 70 goes into slot 71
        assert "conversations/c1/m/0000000071.json" in object_keys(url)
        assert open_store(url).load(CID).messages == [*again, *more]
    finally:
        fresh.close()
        store.close()


def test_an_append_from_a_copy_older_than_the_rewrite_conflicts(url: str) -> None:
    store, msgs = _seventy(url)
    stale = open_store(url)
    try:
        stale.load(CID)  # its copy of the chain is the old one
        again = seal_chain(70, prefix="new")
        store.rewrite(CID, again, expect=msgs[-1].hash)
        with pytest.raises(ConflictError):  # it chains from the old stored hashes
            stale.append(CID, seal_chain(1, msgs[-1]))
        stale.append(CID, seal_chain(1, again[-1]))  # from the rewritten chain: fine
        assert len(open_store(url).load(CID).messages) == 71
    finally:
        stale.close()
        store.close()


def test_a_rewrite_after_a_racing_append_conflicts_and_writes_nothing(url: str) -> None:
    store, msgs = _seventy(url)
    other = open_store(url)
    try:
        other.append(CID, seal_chain(1, msgs[-1]))  # takes slot 70 first
        before = object_keys(url)
        with pytest.raises(ConflictError):
            store.rewrite(CID, seal_chain(70, prefix="new"),
                          expect=msgs[-1].hash)
        assert object_keys(url) == before
    finally:
        other.close()
        store.close()


def test_what_a_kill_or_a_reader_meets_between_the_steps_reads_as_the_rewrite(
        url: str) -> None:
    """The rewrite segment stored, but the index not moved and the superseded objects not
    (or partly) removed: an old snapshot before a gap, an old index. It read as a missing
    segment (seq 64 gone) or a replaced one (the head's hash) before."""
    store, msgs = _seventy(url)
    old_snap, old_index = read_object(url, SNAP), read_object(url, INDEX)
    assert old_snap is not None and old_index is not None
    again = seal_chain(70, prefix="new")
    store.rewrite(CID, again, expect=msgs[-1].hash)
    write_object(url, SNAP, old_snap)  # an old snapshot, the segments after it gone
    write_object(url, INDEX, old_index)  # the head the rewrite replaced
    fresh = open_store(url)
    try:
        assert fresh.load(CID).messages == again
        assert json.loads(read_object(url, INDEX) or b"")["shift"] == 1  # load moved it
        fresh.append(CID, seal_chain(1, again[-1]))
    finally:
        fresh.close()
        store.close()


def test_a_gap_not_followed_by_a_rewrite_is_still_damage(url: str) -> None:
    from chatstate.stores.s3._transport import S3IO, parse_url

    store, _msgs = _seventy(url)
    store.close()
    S3IO(parse_url(url)).delete(["conversations/c1/m/0000000066.json"])
    with pytest.raises(CorruptTranscriptError, match="seq 66 is missing"):
        open_store(url).load(CID)


def test_what_a_kill_left_before_the_removal_is_removed_by_remove_superseded(
        url: str) -> None:
    """``remove_superseded`` (rekey calls it on every conversation it holds) removes the
    segments and snapshots a rewrite superseded when a kill came before the rewrite did."""
    store, msgs = _seventy(url)
    old = {k: read_object(url, k) for k in object_keys(url) if "/m/" in k or "/snap/" in k}
    again = seal_chain(70, prefix="new")
    store.rewrite(CID, again, expect=msgs[-1].hash)
    more = seal_chain(1, again[-1])
    store.append(CID, more)  # an append after the rewrite: kept
    for key, data in old.items():  # as a kill before the removal leaves it
        assert data is not None
        write_object(url, key, data)
    fresh = open_store(url)
    try:
        assert fresh.remove_superseded(CID) == len(old)  # type: ignore[attr-defined]
        assert [k for k in object_keys(url) if "/m/" in k or "/snap/" in k] == [
            "conversations/c1/m/0000000070.json", "conversations/c1/m/0000000071.json"]
        assert fresh.remove_superseded(CID) == 0  # type: ignore[attr-defined]
        assert open_store(url).load(CID).messages == [*again, *more]
    finally:
        fresh.close()
        store.close()
