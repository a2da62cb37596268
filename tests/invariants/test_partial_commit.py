"""Keeping a partial reply in the chain keeps the one the store holds, never an older copy.

A second writer that loaded a conversation while the first was streaming holds an
older copy of the partial; committing it would clear the newer one, losing text
the first writer has already shown. Every store refuses that with ConflictError.
"""

from __future__ import annotations

import pytest

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ConflictError
from chatstate.stores import open_store


def partial(prev: Message, text: str) -> Message:
    return Message.seal(prev, role="assistant", content=text, turn_id="t1", status="partial")


@pytest.mark.invariant(5)
def test_committing_a_stale_partial_is_refused(store_url: str) -> None:
    store = open_store(store_url)
    store.create(Conversation(id="c"))
    user = Message.seal(None, role="user", content="question", turn_id="t1")
    store.append("c", [user])
    older = partial(user, "the first words")
    store.save_partial("c", older)
    newer = partial(user, "the first words and then some more")
    store.save_partial("c", newer)

    with pytest.raises(ConflictError, match="changed since it was loaded"):
        store.append("c", [older])
    conv = open_store(store_url).load("c")
    assert [m.seq for m in conv.messages] == [0]
    assert conv.partial is not None
    assert conv.partial.content == newer.content

    store.append("c", [newer])  # the partial the store holds: kept, visibly, as partial
    conv = open_store(store_url).load("c")
    assert [(m.status, m.content) for m in conv.messages[1:]] == [("partial", newer.content)]
    assert conv.partial is None
    assert conv.verify() is None


@pytest.mark.invariant(5)
def test_a_streaming_writer_stops_once_its_partial_was_kept_by_another(store_url: str) -> None:
    """Writer A streams; writer B keeps A's partial in the chain. A's next flush must fail
    (so A never shows text that is not kept), and what B kept is what A had shown."""
    streaming, keeper = open_store(store_url), open_store(store_url)
    streaming.create(Conversation(id="c"))
    user = Message.seal(None, role="user", content="question", turn_id="t1")
    streaming.append("c", [user])
    shown = partial(user, "what A has shown")
    streaming.save_partial("c", shown)
    seen_by_keeper = keeper.load("c").partial
    assert seen_by_keeper is not None
    assert seen_by_keeper.hash == shown.hash
    keeper.append("c", [seen_by_keeper])
    with pytest.raises(ConflictError):
        streaming.save_partial("c", partial(user, "what A has shown, and more"))
    conv = open_store(store_url).load("c")
    assert [(m.status, m.content) for m in conv.messages[1:]] == [("partial", shown.content)]
    assert conv.partial is None
    assert conv.verify() is None
