"""Every write a turn makes goes through the turn writer and carries the lease's token.

A real json store that records the ``fence`` of each write (and what the lease was
taken under), driven by a Chat over HTTP to the fake model, by the proxy's writer,
and by the integrations' item log.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from chatstate import Chat, make_adapter
from chatstate.core.transcript import Message
from chatstate.stores.json.store import JsonStore
from chatstate.testing import FakeModel

pytestmark = pytest.mark.usefixtures("no_model_settings_from_env")


class FenceLog(JsonStore):
    """The json store, noting each write's fence and each lease's owner token."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.writes: list[tuple[str, str | None]] = []
        self.owners: list[str] = []

    def acquire_lease(self, conversation_id: str, **kwargs: Any) -> Any:
        lease = super().acquire_lease(conversation_id, **kwargs)
        self.owners.append(lease.owner)
        return lease

    def create_leased(self, conversation: Any, messages: Sequence[Message],
                      **kwargs: Any) -> Any:
        lease = super().create_leased(conversation, messages, **kwargs)
        self.owners.append(lease.owner)
        self.writes.append(("create_leased", lease.owner))  # its messages under the lease
        return lease

    def append(self, conversation_id: str, messages: Sequence[Message], *,
               fence: str | None = None) -> None:
        self.writes.append(("append", fence))
        super().append(conversation_id, messages)

    def save_partial(self, conversation_id: str, partial: Message, *,
                     fence: str | None = None) -> None:
        self.writes.append(("save_partial", fence))
        super().save_partial(conversation_id, partial)

    def set_header(self, conversation_id: str, *, title: str | None = None,
                   metadata: dict[str, Any] | None = None, fence: str | None = None) -> None:
        self.writes.append(("set_header", fence))
        super().set_header(conversation_id, title=title, metadata=metadata)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FenceLog]:
    s = FenceLog.from_url(f"json://{tmp_path}/store")
    assert isinstance(s, FenceLog)
    s.open()
    try:
        yield s
    finally:
        s.close()


def test_every_write_of_a_chat_turn_carries_its_lease_token(store: FenceLog) -> None:
    with FakeModel(reply_words=6, chunk_delay=0.01) as fake:
        chat = Chat(store, adapter=make_adapter(base_url=fake.base_url, api_key="test-key",
                                                model="fake-model"), flush_interval=0.0)
        shown = "".join(chat.stream("hello there"))
        chat.send("and again")
    assert shown
    assert len(store.owners) == 2  # one lease per turn, the Chat's own token
    assert len(set(store.owners)) == 1
    kinds = [kind for kind, _ in store.writes]
    assert kinds[:2] == ["append", "set_header"]  # the user message, then its title
    assert "save_partial" in kinds
    assert kinds.count("append") == 4
    assert {fence for _, fence in store.writes} == {store.owners[0]}
    assert chat.writer.held is None  # given up when the turn ended


def test_writes_outside_a_turn_are_unfenced(store: FenceLog) -> None:
    chat = Chat(store, adapter=make_adapter(base_url="http://127.0.0.1:9", api_key="k",
                                            model="m"))
    chat.add_system("be brief")
    chat.set_title("a title")
    assert store.writes == [("append", None), ("set_header", None)]
    assert store.owners == []


def test_the_proxy_writes_through_the_turn_writer_fenced(store: FenceLog) -> None:
    from chatstate.serve._history import HistoryIndex
    from chatstate.serve._turns import Turn, Writer

    writer = Writer(store, HistoryIndex())
    turn = writer.begin(None, [{"role": "user", "content": "hi"}])
    assert isinstance(turn, Turn)
    writer.save_partial(turn, "Hel", "m")
    writer.commit(turn, {"content": "Hello", "model": "m"})
    writer.note_failure(turn, 500, "a later failure, noted")
    writer.end(turn)
    # a new conversation: its lease, header and the user message in one write
    assert [kind for kind, _ in store.writes] == ["create_leased", "save_partial", "append",
                                                   "set_header"]
    assert len(store.owners) == 1
    assert {fence for _, fence in store.writes} == {store.owners[0]}
    conv = store.load(turn.id)
    assert [(m.role, m.content) for m in conv.messages] == [("user", "hi"),
                                                             ("assistant", "Hello")]
    assert conv.metadata["last_upstream_error"]["status"] == 500


def test_the_item_log_appends_through_the_turn_writer(store: FenceLog) -> None:
    from chatstate.integrations._itemlog import ItemLog

    log = ItemLog("items", store, framework="test")
    log.add([{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}])
    assert store.writes == [("append", None)]  # one compare-and-append, no lease held
    assert [i["content"] for i in log.items()] == ["one", "two"]
