"""The 0.2 transcript on every store: each content kind round-trips, and the blob area.

Proves, per store: every content kind (text parts, image URL, small and large image
bytes, file, tool calls, tool results with error/unknown status, unknown part
types, extra provider fields) loads back identical with its chain intact; a 1 MiB
image named by ten turns is stored once; append refuses a message naming a blob
the store lacks and writes nothing; a missing or altered blob is corruption naming
the file/key; a store without a blob area refuses every blob call clearly.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support.richkinds import KINDS, PNG_1MIB, seal_kind
from support.stores import damage_blob, local_path, new_conversation, pg_connect, scheme

from chatstate.core.content import image, inliner, store_parts, text
from chatstate.core.transcript import Message
from chatstate.errors import ChatstateError, CorruptTranscriptError
from chatstate.ops.transfer import export_json, import_into, read_import
from chatstate.stores.base import BlobStore, CollectsBlobs, Store
from chatstate.stores.blobs import verify_blobs
from chatstate.stores.forwarding import ForwardingStore


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_content_kind_round_trips(store: Any, kind: str) -> None:
    prev = new_conversation(store, "c1", 2)[-1]
    rich = seal_kind(store, kind, prev)
    store.append("c1", rich)
    conv = store.load("c1")
    assert conv.messages[2:] == rich
    assert conv.verify() is None
    assert verify_blobs(store, conv) == len({r["sha256"] for m in rich for r in m.blob_refs()})
    after = Message.seal(conv.last, role="user", content="and then?", turn_id="t-2")
    store.append("c1", [after])  # the chain goes on after a rich message
    assert store.load("c1").messages[-1] == after


def test_large_parts_become_blobs_and_inline_back(store: Any) -> None:
    assert isinstance(store, BlobStore)
    new_conversation(store, "c1")
    (msg,) = seal_kind(store, "image-large")
    part = msg.content[1]
    assert isinstance(part, dict)
    assert "url" not in part["image_url"]
    assert part["blob"] == {"sha256": hashlib.sha256(PNG_1MIB).hexdigest(),
                            "size": len(PNG_1MIB), "media_type": "image/png", "name": "big.png"}
    store.append("c1", [msg])
    sent = store.load("c1").messages[0].to_openai(blob=inliner(store))
    assert sent["content"][1] == {"type": "image_url",
                                  "image_url": image(PNG_1MIB)["image_url"]}
    assert store.get_blob(part["blob"]["sha256"]) == PNG_1MIB


def _blob_count(store: Any, url: str) -> int:
    if scheme(url) == "json":
        return len([p for p in (local_path(url) / "blobs").iterdir() if p.is_file()])
    if scheme(url) == "sqlite":
        db = sqlite3.connect(local_path(url))
        try:
            return int(db.execute("SELECT count(*) FROM blobs").fetchone()[0])
        finally:
            db.close()
    if scheme(url) == "postgresql":
        with pg_connect(url) as conn:
            return int(conn.execute("SELECT count(*) FROM blobs").fetchone()[0])
    return len(store.io.keys("blobs"))


def test_one_mib_image_in_ten_turns_is_stored_once(store: Any, store_url: str) -> None:
    new_conversation(store, "c1")
    prev = None
    for turn in range(10):
        content = store_parts(store, [text(f"turn {turn}"), image(PNG_1MIB, name="same.png")])
        prev = Message.seal(prev, role="user", content=content, turn_id=f"t-{turn}")
        store.append("c1", [prev])
    conv = store.load("c1")
    assert len(conv.messages) == 10
    assert conv.verify() is None
    assert _blob_count(store, store_url) == 1
    if scheme(store_url) == "json":  # the transcript holds references, not ten copies
        assert (local_path(store_url) / "c1.json").stat().st_size < 10 * 1024


def test_append_refuses_a_blob_the_store_lacks(store: Any) -> None:
    new_conversation(store, "c1", 1)
    before = store.load("c1")
    ref = {"sha256": hashlib.sha256(b"never stored").hexdigest(), "size": 12,
           "media_type": "image/png"}
    msg = Message.seal(before.last, role="user", turn_id="t-x",
                       content=[{"type": "image_url", "image_url": {}, "blob": ref}])
    with pytest.raises(ChatstateError, match=f"names blob {ref['sha256']} which this store "
                       "does not hold.*nothing was written"):
        store.append("c1", [msg])
    assert store.load("c1").messages == before.messages
    store.put_blob(b"never stored", media_type="image/png")
    store.append("c1", [msg])  # once the blob is there, the same message goes in
    assert store.load("c1").messages[-1] == msg


@pytest.mark.invariant(6)
@pytest.mark.parametrize("how", ["missing", "altered"])
def test_damaged_blob_is_corruption_naming_it(store: Any, store_url: str, how: str) -> None:
    new_conversation(store, "c1")
    rich = seal_kind(store, "image-large")
    store.append("c1", rich)
    sha = rich[0].blob_refs()[0]["sha256"]
    name = damage_blob(store, store_url, sha, how)
    if how == "missing":  # load checks every named blob is there, with its size
        with pytest.raises(CorruptTranscriptError, match="is missing") as exc:
            store.load("c1")
        assert name in str(exc.value)
        assert exc.value.position == 0
        with pytest.raises(ChatstateError, match="does not hold"):
            store.append("c1", [Message.seal(rich[-1], role="user", turn_id="t",
                                             content=rich[0].content)])
    else:  # an altered byte: the digest check of every read (and of verify) finds it
        conv = store.load("c1")
        with pytest.raises(CorruptTranscriptError, match="was altered") as exc:
            verify_blobs(store, conv)
        assert name in str(exc.value)
        with pytest.raises(CorruptTranscriptError, match=sha):
            conv.messages[0].to_openai(blob=inliner(store))
    with pytest.raises(CorruptTranscriptError, match=sha):
        store.get_blob(sha)


def test_plain_messages_stay_in_the_0_1_format(local_store_url: str, tmp_path: Path) -> None:
    from chatstate.stores import open_store

    store = open_store(local_store_url)
    try:
        new_conversation(store, "c1", 2)
        if scheme(local_store_url) == "json":
            raw = (local_path(local_store_url) / "c1.json").read_bytes()
            assert raw.startswith(b'{"schema":1,')
            assert b"tool_calls" not in raw
        store.append("c1", seal_kind(store, "tool-calls", store.load("c1").last))
        if scheme(local_store_url) == "json":  # 0.1 refuses it as newer, not as damaged
            raw = (local_path(local_store_url) / "c1.json").read_bytes()
            assert raw.startswith(b'{"schema":2,')  # already with the record in the log
            store.close()  # which compacts the log into the document
            raw = (local_path(local_store_url) / "c1.json").read_bytes()
            assert raw.startswith(b'{"schema":2,')
            line = raw.splitlines()[1].rstrip(b",")
            assert set(json.loads(line)) == {"seq", "role", "content", "created_at",
                                             "turn_id", "status", "model", "usage", "params",
                                             "hash"}
    finally:
        store.close()


@pytest.mark.invariant(6)
def test_a_truncated_blob_is_never_overwritten(store: Any, store_url: str) -> None:
    new_conversation(store, "c1")
    rich = seal_kind(store, "image-large")
    store.append("c1", rich)
    sha = rich[0].blob_refs()[0]["sha256"]
    name = damage_blob(store, store_url, sha, "truncated")
    with pytest.raises(CorruptTranscriptError, match="has 1000 bytes, not 1048584") as exc:
        store.load("c1")
    assert name in str(exc.value)
    with pytest.raises(CorruptTranscriptError, match=r"stored with 1000 bytes.*left as it is"):
        store.put_blob(PNG_1MIB, media_type="image/png")
    with pytest.raises(CorruptTranscriptError, match="was altered"):
        store.get_blob(sha)  # still the damaged bytes: nothing wrote over them


@pytest.mark.invariant(7)
def test_json_open_removes_a_dead_blob_writers_temp_file(tmp_path: Path) -> None:
    from chatstate.stores import open_store

    url = f"json://{tmp_path}/s"
    store = open_store(url)
    ref = store.put_blob(PNG_1MIB, media_type="image/png")
    store.close()
    blobs = tmp_path / "s" / "blobs"
    assert (blobs.stat().st_mode & 0o777, (blobs / ref["sha256"]).stat().st_mode & 0o777) \
        == (0o700, 0o600)
    stray = blobs / f".{ref['sha256']}.tmp-0123456789abcdef"
    stray.write_bytes(b"half a blob")
    store = open_store(url)
    try:
        assert not stray.exists()
        assert any("blobs/" + stray.name in r for r in store.recovery)
        assert store.get_blob(ref["sha256"]) == PNG_1MIB
    finally:
        store.close()


@pytest.mark.invariant(3)
def test_a_blob_that_cannot_be_made_durable_stores_no_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection (json: its fsyncs are Python's): the blob write fails, nothing stays."""
    import errno
    import os

    from chatstate.stores import open_store

    store = open_store(f"json://{tmp_path}/s")
    try:
        new_conversation(store, "c1", 2)

        def failing_fsync(fd: int) -> None:
            raise OSError(errno.EIO, "injected I/O error")

        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", failing_fsync)
            with pytest.raises(ChatstateError, match="injected I/O error"):
                seal_kind(store, "image-large", store.load("c1").last)
        assert len(store.load("c1").messages) == 2
        assert not store.has_blob(hashlib.sha256(PNG_1MIB).hexdigest())
        assert [p.name for p in (tmp_path / "s" / "blobs").iterdir()] == []  # no temp left
    finally:
        store.close()


# -- a store without a blob area ------------------------------------------------------------


class Blobless(ForwardingStore):
    """The store, less its blob area: how a third-party store without one looks."""

    @classmethod
    def parts(cls, inner: Store) -> list[type]:
        return [p for p in super().parts(inner) if p not in (BlobStore, CollectsBlobs)]


def test_a_store_without_a_blob_area_refuses_blobs_clearly(store: Any, tmp_path: Path) -> None:
    """Every blob call checks the capability and says what is missing; nothing is written."""
    new_conversation(store, "c1")
    rich = seal_kind(store, "image-large")  # stored through the real store, which has blobs
    store.append("c1", rich)
    blobless = Blobless(store)
    conv = blobless.load("c1")
    no_area = f"{store.url}: this store has no blob area for"
    with pytest.raises(ChatstateError, match=f"{re.escape(no_area)} a 1048584-byte image_url"):
        store_parts(blobless, [image(PNG_1MIB)])
    assert store_parts(blobless, [text("small"), image(b"tiny")])[1]["image_url"]  # no blob
    with pytest.raises(ChatstateError, match=f"{re.escape(no_area)} blob "):
        conv.messages[0].to_openai(blob=inliner(blobless))
    with pytest.raises(ChatstateError, match=f"{re.escape(no_area)} the blobs conversation"):
        export_json(conv, blobless)
    with pytest.raises(ChatstateError, match="no blob area for the blobs conversation 'c1'"):
        export_json(conv)  # no store given at all
    with pytest.raises(CorruptTranscriptError, match="names blobs, but this store has no blob"):
        verify_blobs(blobless, conv)
    exported = tmp_path / "c1.json"
    exported.write_text(export_json(conv, store))
    imported = read_import(exported)
    imported.conversation.id = "c2"
    with pytest.raises(ChatstateError, match=f"{re.escape(no_area)} the 1 blob"):
        import_into(blobless, imported)
    assert [s.id for s in store.list_conversations()] == ["c1"]  # nothing was written
    plain = new_conversation(blobless, "c3", 2)  # messages naming no blob are fine
    assert blobless.load("c3").messages == plain
