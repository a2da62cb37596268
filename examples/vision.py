"""Images in a durable conversation: attach a picture, ask twice, replay the transcript.

    .venv/bin/python examples/vision.py [STORE_URL]

The store is STORE_URL, else CHATSTATE_STORE, else SQLite in your user data
directory. Uses the built-in fake model (it echoes what it received), so it runs
offline with no key. The picture (about 120 KiB) is above the 64 KiB threshold:
it is stored once in the store's blob area, and every request carries it inlined
as a data URL.
"""

import os
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import chatstate
from chatstate.ops.transfer import render
from chatstate.stores.blobs import verify_blobs
from chatstate.testing import FakeModel


def png(width: int, height: int) -> bytes:
    """An uncompressed RGB noise picture, so it stays above the blob threshold."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + os.urandom(width * 3) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 0))
            + chunk(b"IEND", b""))


store = chatstate.open_store(sys.argv[1] if len(sys.argv) > 1 else None)
with tempfile.TemporaryDirectory() as scratch, FakeModel() as fake:
    picture = Path(scratch) / "noise.png"
    picture.write_bytes(png(200, 200))
    chat = chatstate.Chat(store, base_url=fake.base_url, api_key="offline")
    # The picture is stored (durably, once) before the message that names it.
    print("assistant>", chat.send("What is in this picture?", attach=[picture]).content)
    print("assistant>", chat.send("And what colour is it mostly?").content)
    for number, entry in enumerate(fake.request_log, 1):
        for part in entry["parts"]:
            if part["type"] == "image_url":
                print(f"request {number}: the model got {part['media_type']}, "
                      f"{part['size']} bytes, sha256 {part['sha256'][:12]}…")

conv = store.load(chat.id)
print(f"conversation {conv.id}:")
print(render(conv, "text"))
blobs = verify_blobs(store, conv)
print(f"{len(conv.messages)} messages, hash chain intact: {conv.verify() is None}, "
      f"{blobs} blob stored once, digest checked")
store.close()
