"""--no-log in the library: ``unlogged(chat)`` sends a turn with the history and stores none
of it, through the same turn writer (on a memory copy)."""

from __future__ import annotations

from pathlib import Path

from chatstate.core.content import image
from chatstate.session.chat import Chat
from chatstate.session.unlogged import unlogged
from chatstate.stores import open_store
from chatstate.testing import FakeModel

PNG = (b"\x89PNG\r\n\x1a\n" + b"\0" * 70_000)  # above the blob threshold: stored as a blob


def test_an_unlogged_turn_sees_the_history_blobs_included_and_stores_nothing(
        tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/u.db")
    with FakeModel(reply_words=1) as fake:
        chat = Chat(store, conversation_id="u1", base_url=fake.base_url, api_key="k-test-key")
        chat.send("look", attach=[image(PNG, media_type="image/png")])
        before = store.load("u1")
        off = unlogged(chat)
        reply = off.send("and now?")
        sent = [e for e in fake.request_log if e["path"] == "/v1/chat/completions"][-1]
    assert reply.text.startswith("Echo: and now?")
    assert off.unlogged and not chat.unlogged
    assert [p["type"] for p in sent["messages"][0]["content"]] == ["text", "image_url"]
    assert sent["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png")
    after = store.load("u1")
    assert [m.hash for m in after.messages] == [m.hash for m in before.messages]
    assert len(off.messages) == len(before.messages) + 2
    store.close()
