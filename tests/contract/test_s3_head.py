"""The s3 store knows its head: a deleted newest segment is corruption, never a free seq.

Against the real moto server on loopback. Before the head was checked, deleting
the newest message object made the conversation load shorter and the next
append reuse the lost seq.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.cli_helpers import invoke
from support.s3server import make_bucket, moto_endpoint, s3_url

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import CorruptTranscriptError
from chatstate.stores import open_store

__all__ = ["moto_endpoint"]  # the fixture, re-exported so pytest finds it here

CID = "c1"
NEWEST = "conversations/c1/m/0000000003.json"


@pytest.fixture
def url(moto_endpoint: str) -> str:
    return s3_url(moto_endpoint, make_bucket(moto_endpoint))


def _four_messages(url: str) -> Any:
    store = open_store(url)
    store.create(Conversation(id=CID, title="t"))
    prev: Message | None = None
    for i in range(4):
        prev = Message.seal(prev, role="user" if i % 2 == 0 else "assistant",
                            content=f"m {i}", turn_id=f"t-{i // 2}")
        store.append(CID, [prev])
    return store


def _objects(store: Any) -> dict[str, bytes]:
    """Every object of the conversation and its index (not the open records)."""
    out = {}
    for prefix in ("conversations", "index"):
        for key, _ in store.io.keys(prefix):
            blob = store.io.get(key)
            out[key] = blob.data if blob else b""
    return out


@pytest.mark.invariant(6)
def test_a_deleted_newest_segment_is_named_on_load(url: str) -> None:
    store = _four_messages(url)
    store.io.delete([NEWEST])
    with pytest.raises(CorruptTranscriptError) as info:
        open_store(url).load(CID)
    assert NEWEST in str(info.value)
    assert info.value.position == 3
    assert "records 4 messages, but only 3 are stored" in str(info.value)


@pytest.mark.invariant(5, 6)
def test_a_deleted_newest_segment_is_never_a_free_seq(url: str) -> None:
    store = _four_messages(url)
    kept = store.load(CID).messages[:3]
    store.io.delete([NEWEST])
    before = _objects(store)
    fresh = open_store(url)  # another process: nothing cached
    reuse = Message.seal(kept[-1], role="assistant", content="another reply", turn_id="t-1")
    assert reuse.seq == 3
    with pytest.raises(CorruptTranscriptError, match="0000000003"):
        fresh.append(CID, [reuse])
    with pytest.raises(CorruptTranscriptError, match="0000000003"):
        fresh.save_partial(CID, Message.seal(kept[-1], role="assistant", content="x",
                                             turn_id="t-1", status="partial"))
    with pytest.raises(CorruptTranscriptError, match="0000000003"):
        fresh.set_header(CID, title="renamed")
    assert _objects(store) == before


def test_replay_verify_and_ask_refuse_a_lost_segment(url: str) -> None:
    store = _four_messages(url)
    store.io.delete([NEWEST])
    before = _objects(store)
    verify = invoke(["replay", CID, "--verify"], store=url)
    assert verify.code == 1, verify.err
    assert NEWEST in verify.err
    asked = invoke(["ask", "--model", "fake", "--id", CID, "hello again"], store=url)
    assert asked.code != 0, asked.err
    assert NEWEST in asked.err, asked.err
    assert _objects(store) == before  # nothing was written: no segment, no partial, no index


def test_old_data_without_a_head_still_loads(url: str) -> None:
    store = _four_messages(url)
    store.io.delete(["index/c1.json"])  # as written before the head was kept
    conv = open_store(url).load(CID)
    assert len(conv.messages) == 4
    assert conv.verify() is None
    reopened = open_store(url)
    reopened.append(CID, [Message.seal(conv.messages[-1], role="user", content="m 4",
                                       turn_id="t-2")])
    assert len(open_store(url).load(CID).messages) == 5
