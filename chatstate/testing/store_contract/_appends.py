"""The store contract: compare-and-append, and the partial reply."""


from __future__ import annotations

import pytest

from chatstate.core.canonical import LARGE_CONTENT
from chatstate.core.transcript import Message
from chatstate.errors import (
    ConflictError,
    CorruptTranscriptError,
)
from chatstate.stores.base import (
    Store,
)
from chatstate.testing.store_contract._base import (
    StoreCase,
    new_conversation,
    partial_after,
    seal_chain,
)
from chatstate.testing.store_contract._crashes import _race


class AppendCases(StoreCase):
    def test_thousand_appends_then_reload(self, store_url: str) -> None:
        store = self.open(store_url)
        msgs = new_conversation(store, "long", 1000)
        store.close()
        reopened = self.open(store_url)
        conv = reopened.load("long")
        assert conv.verify() is None
        assert conv.messages == msgs
        assert reopened.list_conversations()[0].message_count == 1000
        reopened.close()

    def test_append_several_at_once(self, store: Store) -> None:
        msgs = seal_chain(5)
        new_conversation(store, "c1")
        store.append("c1", msgs[:3])
        store.append("c1", msgs[3:])
        assert store.load("c1").messages == msgs

    def test_stale_expected_seq_conflicts_and_writes_nothing(self, store: Store) -> None:
        msgs = new_conversation(store, "c1", 4)
        ahead = seal_chain(3, msgs[-1])[2:]  # seq 6 while the store is at 3
        with pytest.raises(ConflictError) as info:
            store.append("c1", ahead)
        assert (info.value.expected_seq, info.value.actual_seq) == (5, 3)
        assert store.load("c1").messages == msgs

    def test_message_chained_off_stale_last_hash_conflicts(self, store: Store) -> None:
        msgs = new_conversation(store, "c1", 2)
        ours = Message.seal(msgs[-1], role="user", content="ours", turn_id="t-a")
        theirs = Message.seal(msgs[-1], role="user", content="theirs", turn_id="t-b")
        store.append("c1", [theirs])  # the other writer wins seq 2
        reply = Message.seal(ours, role="assistant", content="r", turn_id="t-a")
        for attempt in ([ours], [ours, reply], [reply]):  # reply: sealed off our seq 2
            with pytest.raises(ConflictError):
                store.append("c1", attempt)
        assert store.load("c1").messages == [*msgs, theirs]
        assert store.list_conversations()[0].message_count == 3

    def test_conflict_leaves_partial_alone(self, store: Store) -> None:
        msgs = new_conversation(store, "c1", 1)
        partial = partial_after(msgs[-1])
        store.save_partial("c1", partial)
        with pytest.raises(ConflictError):
            store.append("c1", seal_chain(2, msgs[-1])[1:])
        assert store.load("c1").partial == partial

    def test_unsealed_chain_is_refused(self, store: Store) -> None:
        msgs = new_conversation(store, "c1", 1)
        good = seal_chain(2, msgs[-1])
        forged = good[1].model_copy(update={"content": "forged"})
        with pytest.raises(CorruptTranscriptError):
            store.append("c1", [good[0], forged])
        assert store.load("c1").messages == msgs

    def test_retried_append_never_duplicates(self, store: Store) -> None:
        msgs = new_conversation(store, "c1", 1)
        batch = seal_chain(2, msgs[-1])
        store.append("c1", batch)
        store.append("c1", batch)  # "outcome unknown" -> retry of what landed: a no-op
        store.append("c1", batch[1:])
        more = seal_chain(1, batch[-1])
        store.append("c1", [*batch, *more])  # a retry that overlaps: only the new one lands
        conv = store.load("c1")
        assert conv.messages == [*msgs, *batch, *more]
        assert conv.verify() is None

    def test_ten_megabyte_message_round_trips(self, store: Store) -> None:
        msgs = new_conversation(store, "big", 1)
        big_text = ("0123456789abcdef\u00e9\u4e2d\U0001f600\n" * 500_000)[: 10 * 1024 * 1024]
        big = Message.seal(msgs[-1], role="assistant", content=big_text, turn_id="t")
        store.append("big", [big])
        assert store.load("big").messages[-1].content == big_text
        store.append("big", seal_chain(1, big))
        assert store.load("big").verify() is None

    def test_two_writers_racing_lose_nothing(self, store_url: str) -> None:
        """Both seal their first message on one head: one append must lose, and every
        acknowledged message is stored once, at its seq (processes, or threads in_process)."""
        store = self.open(store_url)
        new_conversation(store, "race", 1)
        results = _race(self, store_url, "race", 25)
        acks = [ack for mine, _ in results for ack in mine]
        assert sum(conflicts for _, conflicts in results) >= 1, "the writers never raced"
        conv = store.load("race")
        assert conv.verify() is None
        assert len(conv.messages) == 1 + len(acks) == 1 + 2 * 25
        for seq, digest in acks:
            assert conv.messages[seq].hash == digest, f"acknowledged seq {seq} replaced"
        store.close()


class PartialCases(StoreCase):
    def test_partial_save_replace_load_clear(self, store_url: str) -> None:
        store = self.open(store_url)
        msgs = new_conversation(store, "c1", 1)
        assert store.load("c1").partial is None
        for content in ("Hel", "Hello, wor"):
            partial = partial_after(msgs[-1], content)
            store.save_partial("c1", partial)
            assert store.load("c1").partial == partial
        store.close()
        store = self.open(store_url)  # an interrupted reply survives a reopen
        assert store.load("c1").partial == partial
        assert store.load("c1").messages == msgs
        store.clear_partial("c1")
        assert store.load("c1").partial is None
        store.clear_partial("c1")  # clearing nothing is fine
        store.close()

    def test_partial_for_wrong_seq_conflicts(self, store: Store) -> None:
        msgs = new_conversation(store, "c1", 2)
        with pytest.raises(ConflictError):
            store.save_partial("c1", partial_after(msgs[0], "x"))
        assert store.load("c1").partial is None

    def test_append_clears_the_partial_of_that_seq(self, store: Store) -> None:
        msgs = new_conversation(store, "c1", 1)
        store.save_partial("c1", partial_after(msgs[-1], "Hel"))
        reply = Message.seal(msgs[-1], role="assistant", content="Hello", turn_id="t-p")
        store.append("c1", [reply])
        conv = store.load("c1")
        assert conv.partial is None
        assert conv.messages == [*msgs, reply]
        nxt = partial_after(reply, "next")
        store.save_partial("c1", nxt)  # the next partial is independent of the cleared one
        assert store.load("c1").partial == nxt

    def test_a_long_reply_round_trips(self, store_url: str) -> None:
        """A reply past ``LARGE_CONTENT`` (which some stores write in pieces), with text
        JSON escapes and non-ASCII, is the same Message as partial, replaced, appended,
        kept as partial in the chain, and after a reopen; a short partial after it too."""
        store = self.open(store_url)
        msgs = new_conversation(store, "c1", 1)
        unit = 'ab"c\\d\n\x01\u00e9\u263a\U0001f600 '
        long = unit * (LARGE_CONTENT // len(unit) + 7)
        for cut in (len(long) // 2, len(long)):
            partial = partial_after(msgs[-1], long[:cut])
            store.save_partial("c1", partial)
            assert store.load("c1").partial == partial
        kept = partial_after(msgs[-1], long + "!")
        store.save_partial("c1", kept)
        store.append("c1", [kept])  # a cut-off reply kept in the chain, as partial
        reply = Message.seal(kept, role="assistant", content=long + "?", turn_id="t-l",
                             usage={"prompt_tokens": 1, "completion_tokens": 2})
        store.save_partial("c1", partial_after(kept, long[:100]))
        store.append("c1", [reply])
        store.close()
        store = self.open(store_url)
        conv = store.load("c1")
        assert conv.messages == [*msgs, kept, reply] and conv.partial is None
        short = partial_after(reply, "short")
        store.save_partial("c1", short)
        assert store.load("c1").partial == short
        store.close()


