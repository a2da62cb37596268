"""The store contract: the content-addressed blob area."""


from __future__ import annotations

import hashlib
from typing import Any

import pytest

from chatstate.core.content import image, inliner, store_parts, text
from chatstate.core.transcript import Message
from chatstate.errors import (
    ChatstateError,
    CorruptTranscriptError,
)
from chatstate.stores.base import (
    BlobStore,
    CollectsBlobs,
    Store,
)
from chatstate.stores.blobs import verify_blobs
from chatstate.testing.store_contract._base import (
    StoreCase,
    _has,
    new_conversation,
)


class BlobCases(StoreCase):
    """The content-addressed blob area (``BlobStore`` stores)."""

    PNG_1MIB = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(b"seed").digest() * (1024 * 1024 // 32)

    @pytest.fixture
    def blobs(self, store: Store) -> Any:
        if not _has(store, BlobStore):
            pytest.skip(f"{type(store).__name__} has no blob area (chatstate.stores.BlobStore)")
        return store

    def image_message(self, store: Store, prev: Message | None, turn: int = 0) -> Message:
        content = store_parts(store, [text(f"turn {turn}"),
                                      image(self.PNG_1MIB, name="big.png")])
        return Message.seal(prev, role="user", content=content, turn_id=f"t-{turn}")

    def test_large_parts_become_blobs_and_inline_back(self, blobs: Any) -> None:
        new_conversation(blobs, "c1")
        msg = self.image_message(blobs, None)
        ref = msg.blob_refs()[0]
        plain_digest = hashlib.sha256(self.PNG_1MIB).hexdigest()
        if self.keyed_blob_addresses:  # an encrypted store: no plaintext digest is stored
            assert ref["sha256"] != plain_digest and len(ref["sha256"]) == 64
            plain_digest = ref["sha256"]
        assert ref == {"sha256": plain_digest,
                       "size": len(self.PNG_1MIB), "media_type": "image/png", "name": "big.png"}
        blobs.append("c1", [msg])
        conv = blobs.load("c1")
        assert conv.messages == [msg]
        assert verify_blobs(blobs, conv) == 1
        sent = conv.messages[0].to_openai(blob=inliner(blobs))
        assert sent["content"][1] == {"type": "image_url",
                                      "image_url": image(self.PNG_1MIB)["image_url"]}
        assert blobs.get_blob(ref["sha256"]) == self.PNG_1MIB
        assert blobs.has_blob(ref["sha256"])

    def test_one_image_in_ten_turns_is_stored_once(self, blobs: Any) -> None:
        new_conversation(blobs, "c1")
        prev = None
        for turn in range(10):
            prev = self.image_message(blobs, prev, turn)
            blobs.append("c1", [prev])
        assert blobs.load("c1").verify() is None
        if _has(blobs, CollectsBlobs):
            assert [size for _, size, _ in blobs.list_blobs()] == [len(self.PNG_1MIB)]

    def test_append_refuses_a_blob_the_store_lacks(self, blobs: Any) -> None:
        before = new_conversation(blobs, "c1", 1)
        ref = {"sha256": self.blob_address(blobs, b"never stored"), "size": 12,
               "media_type": "image/png"}
        msg = Message.seal(before[-1], role="assistant", turn_id="t-x",
                           content=[{"type": "image_url", "image_url": {}, "blob": ref}])
        with pytest.raises(ChatstateError, match=f"names blob {ref['sha256']} which this "
                           "store does not hold.*nothing was written"):
            blobs.append("c1", [msg])
        assert blobs.load("c1").messages == before
        assert not blobs.has_blob(ref["sha256"])
        blobs.put_blob(b"never stored", media_type="image/png")
        blobs.append("c1", [msg])  # once the blob is there, the same message goes in
        assert blobs.load("c1").messages[-1] == msg

    def test_a_digest_that_is_not_a_sha256_is_refused(self, blobs: Any) -> None:
        for bad in ("../../etc/passwd", "ABC", "0" * 63, "g" * 64):
            with pytest.raises(ChatstateError, match="invalid blob digest"):
                blobs.get_blob(bad)
        with pytest.raises(CorruptTranscriptError, match="is missing"):
            blobs.get_blob("0" * 64)

    def test_a_removed_blob_that_a_message_names_is_corruption(self, blobs: Any) -> None:
        if not _has(blobs, CollectsBlobs):
            pytest.skip(f"{type(blobs).__name__} cannot remove blobs (CollectsBlobs)")
        new_conversation(blobs, "c1")
        msg = self.image_message(blobs, None)
        blobs.append("c1", [msg])
        sha = msg.blob_refs()[0]["sha256"]
        assert blobs.remove_blob(sha, idle_for=0.0)
        with pytest.raises(CorruptTranscriptError, match="is missing") as info:
            blobs.load("c1")
        assert sha in str(info.value)
        assert info.value.position == 0

    @pytest.mark.parametrize("how", ["altered", "truncated"])
    def test_a_damaged_blob_is_named_and_never_overwritten(self, blobs: Any, store_url: str,
                                                           how: str) -> None:
        new_conversation(blobs, "c1")
        msg = self.image_message(blobs, None)
        blobs.append("c1", [msg])
        sha = msg.blob_refs()[0]["sha256"]
        self.damage_blob(store_url, sha, how)
        if how == "truncated":  # load checks every named blob's size
            with pytest.raises(CorruptTranscriptError, match="has 1000 bytes") as info:
                blobs.load("c1")
            assert sha in str(info.value)
            with pytest.raises(CorruptTranscriptError, match="stored with 1000 bytes"):
                blobs.put_blob(self.PNG_1MIB, media_type="image/png")
        else:  # an altered byte: the digest check of every read finds it
            with pytest.raises(CorruptTranscriptError, match="was altered"):
                verify_blobs(blobs, blobs.load("c1"))
        with pytest.raises(CorruptTranscriptError, match="was altered"):
            blobs.get_blob(sha)  # still the damaged bytes: nothing wrote over them


