"""The store contract: conversations created, listed, loaded, deleted and named."""


from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from chatstate.core.transcript import Conversation
from chatstate.errors import (
    ConflictError,
    ConversationNotFound,
    InvalidConversationId,
)
from chatstate.stores.base import (
    CheckReport,
    Store,
)
from chatstate.testing.store_contract._base import (
    StoreCase,
    new_conversation,
    partial_after,
    seal_chain,
)


class ConversationCases(StoreCase):
    def test_create_then_load_empty(self, store: Store) -> None:
        store.create(Conversation(id="c1", title="hello", metadata={"k": [1, "two"]}))
        conv = store.load("c1")
        assert (conv.id, conv.title, conv.metadata) == ("c1", "hello", {"k": [1, "two"]})
        assert conv.messages == []
        assert conv.partial is None

    def test_create_existing_id_conflicts(self, store: Store) -> None:
        new_conversation(store, "c1", 2)
        with pytest.raises(ConflictError):
            store.create(Conversation(id="c1"))
        assert len(store.load("c1").messages) == 2

    def test_list_newest_first_with_title_and_count(self, store: Store) -> None:
        assert store.list_conversations() == []
        for cid, n in (("a", 1), ("b", 3), ("c", 2)):
            new_conversation(store, cid, n, title=f"title {cid}")
            time.sleep(0.002)
        assert [s.id for s in store.list_conversations()] == ["c", "b", "a"]
        store.append("a", seal_chain(1, store.load("a").last))  # an append makes it newest
        listed = store.list_conversations()
        assert [(s.id, s.title, s.message_count) for s in listed] == [
            ("a", "title a", 2), ("c", "title c", 2), ("b", "title b", 3)]
        assert listed[0].updated_at > listed[1].updated_at
        assert [s.id for s in store.list_conversations(limit=2)] == ["a", "c"]

    def test_list_survives_metadata_that_looks_like_messages(self, store: Store) -> None:
        new_conversation(store, "m", 1, title="t", metadata={"a": 1, "messages": [1, 2]})
        store.set_header("m", metadata={"x": 0, "messages": ["looks", "like", "a", "list"]})
        [summary] = store.list_conversations()
        assert (summary.id, summary.title, summary.message_count) == ("m", "t", 1)

    def test_delete(self, store: Store) -> None:
        new_conversation(store, "gone", 3)
        store.save_partial("gone", partial_after(store.load("gone").last))
        new_conversation(store, "kept", 1)
        store.delete("gone")
        with pytest.raises(ConversationNotFound):
            store.load("gone")
        with pytest.raises(ConversationNotFound):
            store.delete("gone")
        assert [s.id for s in store.list_conversations()] == ["kept"]
        new_conversation(store, "gone", 0)  # the id is free again, with no stale partial
        assert store.load("gone").partial is None
        assert store.load("gone").messages == []

    def test_missing_conversation_is_not_found(self, store: Store) -> None:
        calls: list[Callable[[], Any]] = [
            lambda: store.load("nope"), lambda: store.append("nope", seal_chain(1)),
            lambda: store.set_header("nope", title="x"),
            lambda: store.save_partial("nope", seal_chain(1)[0])]
        for call in calls:
            with pytest.raises(ConversationNotFound) as info:
                call()
            assert "nope" in str(info.value)
            assert isinstance(info.value, KeyError)

    BAD_IDS: ClassVar[dict[str, str]] = {
        "slash": "a/b", "parent": "../escape", "dotdot": "..", "dot": ".", "nul": "x\0y",
        "300chars": "z" * 300, "empty": "", "backslash": "a\\b", "absolute": "/abs",
        "space": "sp ace", "newline": "a\nb"}

    @pytest.mark.parametrize("bad", BAD_IDS.values(), ids=BAD_IDS.keys())
    def test_invalid_ids_are_refused(self, store: Store, bad: str) -> None:
        new_conversation(store, "ok", 1)
        msg = seal_chain(1)[0]
        calls: dict[str, Callable[[], Any]] = {
            "create": lambda: store.create(Conversation(id=bad)),
            "load": lambda: store.load(bad),
            "append": lambda: store.append(bad, [msg]),
            "save_partial": lambda: store.save_partial(bad, msg),
            "clear_partial": lambda: store.clear_partial(bad),
            "set_header": lambda: store.set_header(bad, title="t"),
            "delete": lambda: store.delete(bad),
        }
        for name, call in calls.items():
            with pytest.raises(InvalidConversationId) as info:
                call()
            assert isinstance(info.value, ValueError), name
        assert [s.id for s in store.list_conversations()] == ["ok"]

    ODD_IDS = (".hidden", ".x.tmp-1", ".x.json.tmp-0123456789abcdef", "a.tmp-b", "-", "_..._",
               "A" * 128, "partials", ".partials", ".locks", ".chatstate", "blobs")

    def test_valid_but_odd_ids_survive_reopen(self, store_url: str) -> None:
        store = self.open(store_url)
        for cid in self.ODD_IDS:
            new_conversation(store, cid, 2)
            store.save_partial(cid, partial_after(store.load(cid).last, "p"))
        store.close()
        store = self.open(store_url)  # recovery must not mistake any of them for debris
        assert sorted(s.id for s in store.list_conversations()) == sorted(self.ODD_IDS)
        for cid in self.ODD_IDS:
            conv = store.load(cid)
            assert len(conv.messages) == 2, cid
            assert conv.partial is not None, cid
        store.close()

    def test_set_header(self, store: Store) -> None:
        msgs = new_conversation(store, "c1", 2, title="old")
        before = store.load("c1")
        time.sleep(0.002)
        store.set_header("c1", title="new title")
        store.set_header("c1", metadata={"tags": ["a"], "n": 1})
        conv = store.load("c1")
        assert (conv.title, conv.metadata) == ("new title", {"tags": ["a"], "n": 1})
        assert conv.messages == msgs
        assert conv.created_at == before.created_at
        assert conv.updated_at > before.updated_at
        assert store.list_conversations()[0].title == "new title"

    def test_check_writes_reads_and_deletes_a_probe(self, store: Store) -> None:
        report = store.check()
        assert isinstance(report, CheckReport)
        assert report.ok, report.error
        assert report.error is None
        assert len(report.steps) >= 3
        assert report.url == store.url
        assert store.check().ok  # and again: the probe was cleaned up
        assert store.list_conversations() == []

    def test_every_open_is_recorded(self, store_url: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
        self.open(store_url).close()
        monkeypatch.setenv("DEPLOY_ID", "deploy-42")
        store = self.open(store_url)
        opens = store.opens()
        assert len(opens) == 2
        assert opens[-1]["deploy_id"] == "deploy-42"
        assert opens[0]["deploy_id"] != "deploy-42"
        for rec in opens:
            assert {"boot_id", "hostname", "deploy_id", "opened_at", "pid"} <= set(rec)
        assert opens[0]["opened_at"] <= opens[1]["opened_at"]
        store.record_open({"note": "by hand"})
        assert store.opens()[-1] == {"note": "by hand"}
        store.close()


