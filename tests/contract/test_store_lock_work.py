"""A large append or load must not hold the sqlite store's one connection lock while it
encodes, hashes or decodes its messages: that CPU work is in proportion to the batch
(seconds for 200,000 messages), and every other writer and reader of the store (each
small request of ``chatstate serve``) waited behind it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import chatstate.stores._relational._reads as relational  # where a load decodes its rows
from chatstate.core.transcript import Conversation, Message, new_turn_id
from chatstate.stores.sqlite.store import SqliteStore


def test_append_and_load_do_their_cpu_work_outside_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SqliteStore.from_url(f"sqlite://{tmp_path}/lock.db")
    store.open()
    try:
        store.create(Conversation(id="big", title="big"))
        batch: list[Message] = []
        for i in range(50):
            batch.append(Message.seal(batch[-1] if batch else None, role="user",
                                      content=f"message {i}", turn_id=new_turn_id()))
        locked: list[str] = []
        body, decode = Message.body, relational.decode_rows

        def watched_body(self: Message) -> str:
            if store._lock._is_owned():  # type: ignore[attr-defined]
                locked.append("body")
            return body(self)

        def watched_decode(*args: Any, **kwargs: Any) -> list[Message]:
            if store._lock._is_owned() and args[0]:  # type: ignore[attr-defined]
                locked.append("decode")  # (verifying an empty chain before a write is free)
            return decode(*args, **kwargs)

        monkeypatch.setattr(Message, "body", watched_body)
        monkeypatch.setattr(relational, "decode_rows", watched_decode)
        store.append("big", batch)
        store._seen.clear()  # as another process would: the chain is read afresh
        loaded = store.load("big")
        assert [m.hash for m in loaded.messages] == [m.hash for m in batch]
        assert locked == []
    finally:
        store.close()
