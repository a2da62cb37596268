"""Content parts in the library: building them, blobs at send time, inlined on the wire.

Proves: image()/file()/attachment() from a path, URL, bytes, base64 and data URL,
media types guessed; parts above BLOB_THRESHOLD become blob references when a turn
is sent (Chat.send/stream, AsyncChat) while smaller ones stay inline; the model
receives every image whole, as a data URL (the fake's request log), on each later
turn too; bad input is a clear error and stores nothing.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatstate import AsyncChat, Chat, open_store
from chatstate.core.content import (
    BLOB_THRESHOLD,
    attachment,
    data_url,
    file,
    image,
    inline_part,
    store_parts,
    text,
)
from chatstate.errors import ChatstateError
from chatstate.testing import FakeModel

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")
BIG = b"\xff\xd8\xff" + bytes(range(256)) * 300  # a 76,803-byte "jpeg"
SMALL = b"GIF89a" + b"\x00" * 100


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel() as model:
        yield model


def chat_for(store: Any, fake: FakeModel, cid: str = "v") -> Chat:
    return Chat(store, conversation_id=cid, base_url=fake.base_url, model="fake-model",
                api_key="sk-test-content-0123456789")


def test_parts_from_every_source(tmp_path: Path) -> None:
    jpg = tmp_path / "photo.jpeg"
    jpg.write_bytes(BIG)
    from_path = image(jpg)
    assert from_path == {"type": "image_url", "name": "photo.jpeg",
                         "image_url": {"url": data_url(BIG, "image/jpeg")}}
    assert image(BIG, media_type="image/jpeg")["image_url"] == from_path["image_url"]
    assert image(base64=base64.b64encode(BIG).decode(), media_type="image/jpeg")[
        "image_url"] == from_path["image_url"]
    assert image(data_url(BIG, "image/jpeg"))["image_url"] == from_path["image_url"]
    assert image("https://example.invalid/a.png", detail="high") == {
        "type": "image_url", "image_url": {"url": "https://example.invalid/a.png",
                                           "detail": "high"}}
    pdf = tmp_path / "r.pdf"
    pdf.write_bytes(b"%PDF-1.4")
    assert file(pdf) == {"type": "file", "file": {
        "filename": "r.pdf", "file_data": data_url(b"%PDF-1.4", "application/pdf")}}
    assert attachment(str(jpg))["type"] == "image_url"
    assert attachment(pdf)["type"] == "file"
    assert attachment("https://example.invalid/x")["type"] == "image_url"
    with pytest.raises(ChatstateError, match=r"nope\.png"):
        image(tmp_path / "nope.png")
    with pytest.raises(ChatstateError, match="base64"):
        image(base64="not base64!")
    with pytest.raises(ChatstateError, match="not a URL"):
        file("https://example.invalid/r.pdf")


def test_threshold_and_inline(tmp_path: Path) -> None:
    store = open_store(f"json://{tmp_path}/s")
    try:
        parts = store_parts(store, [text("x"), image(SMALL, media_type="image/gif"),
                                    image(BIG, media_type="image/jpeg", name="big.jpg"),
                                    image(b"z" * BLOB_THRESHOLD)])
        assert parts[1] == image(SMALL, media_type="image/gif")  # small: inline, unchanged
        assert parts[2]["blob"]["name"] == "big.jpg"
        assert "name" not in parts[2]
        assert "blob" not in parts[3]  # exactly at the threshold stays inline
        assert inline_part(parts[2], BIG) == {"type": "image_url",
                                              "image_url": {"url": data_url(BIG, "image/jpeg")}}
    finally:
        store.close()


def test_send_stores_blobs_and_the_model_gets_data_urls(local_store_url: str,
                                                        fake: FakeModel,
                                                        tmp_path: Path) -> None:
    jpg = tmp_path / "cat.jpg"
    jpg.write_bytes(BIG)
    store = open_store(local_store_url)
    try:
        chat = chat_for(store, fake)
        reply = chat.send("what is it?", attach=[jpg, image(SMALL, media_type="image/gif")])
        assert reply.content.startswith(
            f"Echo: what is it? [image/jpeg {len(BIG)} bytes] [image/gif {len(SMALL)} bytes]")
        user = chat.messages[0]
        assert user.blob_refs() == [{"sha256": hashlib.sha256(BIG).hexdigest(),
                                     "size": len(BIG), "media_type": "image/jpeg",
                                     "name": "cat.jpg"}]
        assert store.load("v").messages == chat.messages  # durable, as sent
        assert chat.conversation.title == "what is it?"
        "".join(chat.stream([text("and now?")]))  # the next turn re-sends the image
        for entry in fake.request_log:
            sent = entry["body"]["messages"][0]["content"]
            assert sent[1] == {"type": "image_url",
                               "image_url": {"url": data_url(BIG, "image/jpeg")}}
            assert [p.get("sha256") for p in entry["parts"][:3]] == [
                None, hashlib.sha256(BIG).hexdigest(), hashlib.sha256(SMALL).hexdigest()]
        assert len(fake.request_log) == 2
    finally:
        store.close()


def test_async_chat_attaches_too(tmp_path: Path, fake: FakeModel) -> None:
    async def run() -> Any:
        chat = await AsyncChat.open(f"sqlite://{tmp_path}/s.db", conversation_id="a",
                                    base_url=fake.base_url, model="fake-model",
                                    api_key="sk-test-content-0123456789")
        reply = await chat.send("see", attach=[image(BIG, name="b.jpg")])
        streamed = [d async for d in chat.stream("again", attach=[file(b"%PDF", name="f.pdf")])]
        return reply, "".join(streamed), chat.messages

    reply, streamed, messages = asyncio.run(run())
    assert f"[image/png {len(BIG)} bytes]" in reply.content
    assert streamed.startswith("Echo: again [application/octet-stream 4 bytes]")
    assert messages[0].blob_refs()[0]["name"] == "b.jpg"


def test_a_bad_part_stores_nothing(tmp_path: Path, fake: FakeModel) -> None:
    store = open_store(f"json://{tmp_path}/s")
    try:
        chat = chat_for(store, fake)
        with pytest.raises(ChatstateError, match=r"gone\.png"):
            chat.send("x", attach=[tmp_path / "gone.png"])
        with pytest.raises(ChatstateError, match="part 0 has no string 'type'"):
            chat.send([{"text": "no type"}])
        assert store.list_conversations() == []
        assert fake.request_log == []
    finally:
        store.close()
