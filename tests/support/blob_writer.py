"""Child process for test_blob_crash: put a blob, append a message naming it, print the ack.

    python blob_writer.py STORE_URL CID

Each turn stores a fresh 200 KiB blob (durable) and then appends a user message
naming it; ``ack SEQ`` is printed only after the append returned.
"""

from __future__ import annotations

import os
import sys

from chatstate.core.content import image, store_parts
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ConversationNotFound
from chatstate.stores import open_store

store = open_store(sys.argv[1])
cid = sys.argv[2]
try:
    prev = store.load(cid).last
except ConversationNotFound:
    store.create(Conversation(id=cid))
    prev = None
while True:
    content = store_parts(store, [image(os.urandom(200 * 1024), media_type="image/png")])
    prev = Message.seal(prev, role="user", content=content, turn_id="t")
    store.append(cid, [prev])
    print(f"ack {prev.seq}", flush=True)
