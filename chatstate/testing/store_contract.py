"""The store contract as test classes: a store, chatstate's or yours, joins with one fixture.

    import pytest
    from chatstate.stores import register
    from chatstate.testing.store_contract import StoreContract

    register("mystore", "mypackage.store:MyStore")

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store_url(self, tmp_path):
            return f"mystore://{tmp_path}/store"   # a fresh, empty store for each case

Every case opens ``store_url`` with ``chatstate.stores.open_store``, so the durability
guard runs first. A subclass may set:

- ``allow_ephemeral = True`` for a store the guard calls ephemeral (``memory://``, tmpfs);
- ``keyed_blob_addresses = True`` for an encrypted store (blob addresses are keyed digests);
- ``in_process = True`` when the state lives in the test process (``memory://``): the
  crash cases then reopen within the process; otherwise a child process writes and is
  killed with SIGKILL (it opens the store again from its URL, so the store's class must
  be importable: a module-level class, registered in a module the child can import);
- ``damage(store_url, conversation_id, seq)`` and ``damage_blob(store_url, sha256, how)``:
  hooks that damage stored data behind the store's back, for the cases proving damage
  is refused and never written over. Without them those cases skip, saying why.

The optional parts are tested when the store has them (``isinstance`` against the
protocols of ``chatstate.stores.base``) and skipped, saying so, when it has not: the
blob cases need ``BlobStore``, the lease and fencing cases ``Leases``. The mixins
(``ConversationCases``, ``AppendCases``...) may also be joined one by one.

Needs only pytest and chatstate. Running this module (``python -m``) is the child
writer of the crash and race cases.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import pytest

from chatstate.core.canonical import LARGE_CONTENT
from chatstate.core.content import image, inliner, store_parts, text
from chatstate.core.fields import Role
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    ConversationInUse,
    ConversationNotFound,
    CorruptTranscriptError,
    InvalidConversationId,
    LeaseLost,
)
from chatstate.stores import open_store, register, store_class
from chatstate.stores.base import (
    BlobStore,
    CheckReport,
    CollectsBlobs,
    Leases,
    Rewrites,
    Store,
    create_leased,
)
from chatstate.stores.blobs import verify_blobs

__all__ = ["AppendCases", "BlobCases", "ConversationCases", "CrashCases", "CreateLeasedCases",
           "DamageCases", "FencingCases", "PartialCases", "RewriteCases", "StoreCase",
           "StoreContract", "new_conversation", "seal_chain"]


def seal_chain(n: int, prev: Message | None = None, *, prefix: str = "msg",
               turn_id: str = "t-1") -> list[Message]:
    """``n`` sealed messages after ``prev``, alternating user/assistant, content "msg <seq>"."""
    out: list[Message] = []
    for _ in range(n):
        seq = 0 if prev is None else prev.seq + 1
        role: Role = "user" if seq % 2 == 0 else "assistant"
        prev = Message.seal(prev, role=role, content=f"{prefix} {seq}", turn_id=turn_id)
        out.append(prev)
    return out


def new_conversation(store: Store, cid: str = "c1", n: int = 0, **header: Any) -> list[Message]:
    """Create ``cid`` and append ``n`` messages (``seal_chain``) one by one; return them."""
    store.create(Conversation(id=cid, **header))
    msgs = seal_chain(n)
    for m in msgs:
        store.append(cid, [m])
    return msgs


def partial_after(prev: Message | None, content: str = "half a rep") -> Message:
    return Message.seal(prev, role="assistant", content=content, turn_id="t-p",
                        status="partial")


class StoreCase:
    """The fixtures and settings every group of cases shares (see the module docstring)."""

    allow_ephemeral = False
    in_process = False
    keyed_blob_addresses = False
    """True for an encrypted store: a blob's address is a keyed digest, not its sha256."""

    def blob_address(self, store: Any, data: bytes) -> str:
        """The address ``put_blob(data)`` will give (an encrypted store overrides this)."""
        return hashlib.sha256(data).hexdigest()

    def open(self, url: str) -> Any:
        return open_store(url, allow_ephemeral=self.allow_ephemeral)

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[Any]:
        opened = self.open(store_url)
        try:
            yield opened
        finally:
            opened.close()

    @pytest.fixture
    def reopen(self, store_url: str) -> Iterator[Callable[[], Any]]:
        """Open ``store_url`` again, as a fresh store object (closed after the case)."""
        opened: list[Any] = []

        def again() -> Any:
            opened.append(self.open(store_url))
            return opened[-1]

        yield again
        for each in opened:
            each.close()

    def damage(self, store_url: str, conversation_id: str, seq: int) -> None:
        """Edit message ``seq`` (content "msg <seq>") behind the store's back, leaving its
        stored hash, so the chain no longer verifies there."""
        pytest.skip(f"{type(self).__name__} has no damage(store_url, conversation_id, seq) "
                    "hook: implement it to prove damaged chains are refused")

    def damage_blob(self, store_url: str, sha256: str, how: str) -> None:
        """Make the stored blob ``how`` = "altered" (first byte changed) or "truncated"
        (its first 1000 bytes kept), behind the store's back."""
        pytest.skip(f"{type(self).__name__} has no damage_blob(store_url, sha256, how) "
                    "hook: implement it to prove damaged blobs are refused")


def _has(store: Store, part: type) -> bool:
    """``isinstance`` against an optional protocol part (without narrowing ``store``)."""
    return isinstance(store, part)


def _state(store: Store, cid: str) -> tuple[Any, ...]:
    """What a write to ``cid`` could change, to show that a refused one changed nothing."""
    conv = store.load(cid)
    return conv.title, conv.metadata, conv.messages, conv.partial


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


class CrashCases(StoreCase):
    """A writer killed at any instant loses nothing it was told is stored."""

    def test_a_killed_writer_loses_nothing_acknowledged(self, store_url: str) -> None:
        store = self.open(store_url)
        new_conversation(store, "crash", 1)
        store.close()
        acks = _crash(self, store_url, "crash", 30)
        store = self.open(store_url)  # a fresh store object, from the URL
        conv = store.load("crash")
        assert conv.verify() is None
        assert len(conv.messages) >= 1 + len(acks)
        for seq, digest in acks:
            assert conv.messages[seq].hash == digest, f"acknowledged seq {seq} lost"
        if conv.partial is not None:
            assert conv.partial.seq == conv.last_seq + 1
        store.append("crash", seal_chain(1, conv.last))  # and it takes the next write
        store.close()

    def test_the_partial_reply_of_a_killed_writer_survives(self, store_url: str) -> None:
        store = self.open(store_url)
        msgs = new_conversation(store, "cut", 1)
        store.close()
        saved = _crash(self, store_url, "cut", 1, stall=True)
        store = self.open(store_url)
        conv = store.load("cut")
        assert conv.messages == msgs
        assert conv.partial is not None
        assert (conv.partial.seq, conv.partial.hash) == saved[0]
        store.close()


class FencingCases(StoreCase):
    """Writer leases, and writes fenced with the lease's owner token (``Leases`` stores)."""

    @pytest.fixture
    def leased(self, store: Store) -> tuple[Any, Any, list[Message]]:
        """A conversation mid-reply, its lease held for 0.3 s: (store, lease, messages)."""
        if not isinstance(store, Leases):
            pytest.skip(f"{type(store).__name__} has no writer leases (chatstate.stores.Leases)")
        msgs = new_conversation(store, "c1", 2)
        store.save_partial("c1", partial_after(msgs[-1]))
        return store, store.acquire_lease("c1", term=0.3), msgs

    WRITES: ClassVar[dict[str, Callable[[Any, list[Message], str | None], None]]] = {
        "append": lambda s, msgs, fence: s.append("c1", seal_chain(1, msgs[-1]), fence=fence),
        "save_partial": lambda s, msgs, fence: s.save_partial(
            "c1", partial_after(msgs[-1], "more"), fence=fence),
        "clear_partial": lambda s, _msgs, fence: s.clear_partial("c1", fence=fence),
        "set_header": lambda s, _msgs, fence: s.set_header("c1", title="mine", fence=fence),
    }

    def test_one_live_writer_per_conversation(self, leased: Any, reopen: Any) -> None:
        first, lease, _ = leased
        second = reopen()
        with pytest.raises(ConversationInUse) as info:
            second.acquire_lease("c1", term=30)
        assert f"pid {os.getpid()}" in str(info.value)
        first.release_lease(lease)
        second.release_lease(second.acquire_lease("c1"))

    @pytest.mark.parametrize("write", sorted(WRITES))
    def test_a_fenced_write_by_the_owner_lands(self, leased: Any, write: str) -> None:
        store, lease, msgs = leased
        before = _state(store, "c1")
        self.WRITES[write](store, msgs, lease.owner)
        assert _state(store, "c1") != before

    @pytest.mark.parametrize("write", sorted(WRITES))
    def test_a_fenced_write_after_a_takeover_is_refused(self, leased: Any, reopen: Any,
                                                        write: str) -> None:
        store, lease, msgs = leased
        time.sleep(0.5)  # our lease lapsed (we stalled): another writer takes it
        reopen().acquire_lease("c1", term=30)
        before = _state(store, "c1")
        with pytest.raises(LeaseLost):
            self.WRITES[write](store, msgs, lease.owner)
        assert _state(reopen(), "c1") == before

    def test_a_lapsed_lease_nobody_took_still_fences_for_its_writer(self,
                                                                    leased: Any) -> None:
        store, lease, msgs = leased
        time.sleep(0.5)
        self.WRITES["append"](store, msgs, lease.owner)
        assert len(store.load("c1").messages) == 3

    def test_unfenced_writes_pass_a_held_lease(self, leased: Any, reopen: Any) -> None:
        store, _lease, msgs = leased
        other = reopen()
        self.WRITES["append"](other, msgs, None)  # migrate, import: still compare-and-append
        with pytest.raises(ConflictError):
            self.WRITES["append"](other, msgs, None)
        assert len(store.load("c1").messages) == 3


class CreateLeasedCases(StoreCase):
    """A conversation started in one step: lease, header and first messages
    (``chatstate.stores.base.create_leased``: the store's own ``CreatesLeased`` method,
    or the three calls composed for a store without it)."""

    def test_create_leased_writes_the_header_the_messages_and_holds_the_lease(
            self, store: Store, reopen: Any) -> None:
        msgs = seal_chain(2)
        lease = create_leased(store, Conversation(id="c1", title="hi", metadata={"k": 1}),
                              msgs, owner="me-1")
        conv = reopen().load("c1")
        assert (conv.title, conv.metadata, conv.messages) == ("hi", {"k": 1}, msgs)
        if not isinstance(store, Leases):
            assert lease is None
            return
        assert lease.owner == "me-1"
        with pytest.raises(ConversationInUse):
            reopen().acquire_lease("c1", term=30)
        store.append("c1", seal_chain(1, msgs[-1]), fence=lease.owner)  # it fences
        store.release_lease(lease)
        reopen().release_lease(reopen().acquire_lease("c1"))

    def test_create_leased_with_no_messages_is_create(self, store: Store) -> None:
        lease = create_leased(store, Conversation(id="c1", title="empty"), [])
        assert store.load("c1").messages == []
        if isinstance(store, Leases):
            store.release_lease(lease)

    def test_create_leased_on_an_existing_id_conflicts_and_writes_nothing(
            self, store: Store, reopen: Any) -> None:
        msgs = new_conversation(store, "c1", 1, title="first")
        before = _state(store, "c1")
        with pytest.raises(ConflictError):
            create_leased(store, Conversation(id="c1", title="second"), seal_chain(2),
                          owner="me-2")
        assert _state(reopen(), "c1") == before
        assert store.load("c1").messages == msgs
        if isinstance(store, Leases):  # no lease left behind
            reopen().release_lease(reopen().acquire_lease("c1"))

    def test_create_leased_under_a_live_lease_writes_nothing(self, store: Store,
                                                            reopen: Any) -> None:
        if not isinstance(store, Leases):
            pytest.skip(f"{type(store).__name__} has no writer leases")
        other = reopen()
        held = other.acquire_lease("c1", term=30)
        with pytest.raises(ConversationInUse):
            create_leased(store, Conversation(id="c1"), seal_chain(2), owner="me-3")
        with pytest.raises(ConversationNotFound):
            reopen().load("c1")
        other.release_lease(held)

    @pytest.mark.parametrize("bad", ["from seq 1", "unsealed"])
    def test_create_leased_with_a_broken_chain_writes_nothing(self, store: Store,
                                                             reopen: Any, bad: str) -> None:
        msgs = seal_chain(3)
        batch = msgs[1:] if bad == "from seq 1" else \
            [msgs[0], msgs[1].model_copy(update={"content": "edited"})]
        with pytest.raises((ConflictError, CorruptTranscriptError)):
            create_leased(store, Conversation(id="c1"), batch, owner="me-4")
        with pytest.raises(ConversationNotFound):
            reopen().load("c1")
        if isinstance(store, Leases):
            reopen().release_lease(reopen().acquire_lease("c1"))


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


class DamageCases(StoreCase):
    """Damaged data is refused, named by position, and never written over."""

    def test_writes_onto_a_chain_that_does_not_verify_are_refused(
            self, store: Store, store_url: str, reopen: Any) -> None:
        msgs = new_conversation(store, "c1", 3)
        self.damage(store_url, "c1", 1)
        writer = reopen()  # a fresh writer, nothing cached
        writes: dict[str, Callable[[], Any]] = {
            "load": lambda: writer.load("c1"),
            "append": lambda: writer.append("c1", seal_chain(1, msgs[-1])),
            "save_partial": lambda: writer.save_partial("c1", partial_after(msgs[-1])),
            "set_header": lambda: writer.set_header("c1", title="renamed"),
        }
        for name, write in writes.items():
            with pytest.raises(CorruptTranscriptError) as info:
                write()
            assert info.value.position == 1, (name, str(info.value))
        with pytest.raises(CorruptTranscriptError) as again:
            reopen().load("c1")  # still there, as it was: nothing wrote over it
        assert again.value.position == 1
        assert [s.id for s in writer.list_conversations()] == ["c1"]  # listing still works


class RewriteCases(StoreCase):
    """Every message of a conversation replaced at once (``rekey`` in place). Optional, as
    ``Rewrites`` is: not part of ``StoreContract``; a store that implements ``Rewrites``
    mixes it in beside it."""

    @pytest.fixture
    def rewritable(self, store: Store) -> tuple[Any, list[Message]]:
        assert isinstance(store, Rewrites), (
            f"{type(store).__name__} does not implement chatstate.stores.Rewrites: mix "
            "RewriteCases only into the contract of a store that rewrites in place")
        return store, new_conversation(store, "c1", 3)

    def test_a_rewrite_swaps_every_message_and_the_chain_goes_on(
            self, rewritable: Any, reopen: Any) -> None:
        store, msgs = rewritable
        again = seal_chain(3, prefix="rewritten")
        store.rewrite("c1", again, expect=msgs[-1].hash)
        fresh = reopen()
        assert fresh.load("c1").messages == again
        more = seal_chain(1, again[-1])
        fresh.append("c1", more)
        assert store.load("c1").messages == [*again, *more]

    def test_a_rewrite_after_another_append_conflicts_and_changes_nothing(
            self, rewritable: Any, reopen: Any) -> None:
        store, msgs = rewritable
        reopen().append("c1", seal_chain(1, msgs[-1]))
        before = _state(store, "c1")
        with pytest.raises(ConflictError):
            store.rewrite("c1", seal_chain(3, prefix="stale"), expect=msgs[-1].hash)
        with pytest.raises(ConflictError):  # the right tip, but one message short
            store.rewrite("c1", seal_chain(3, prefix="short"), expect=before[2][-1].hash)
        assert _state(store, "c1") == before

    def test_a_rewrite_that_does_not_chain_is_refused(self, rewritable: Any) -> None:
        store, msgs = rewritable
        broken = seal_chain(3, prefix="broken")
        broken[1] = broken[1].model_copy(update={"content": "edited"})
        before = _state(store, "c1")
        with pytest.raises(CorruptTranscriptError):
            store.rewrite("c1", broken, expect=msgs[-1].hash)
        assert _state(store, "c1") == before


class StoreContract(ConversationCases, AppendCases, PartialCases, CrashCases, FencingCases,
                    CreateLeasedCases, BlobCases, DamageCases):
    """Every case of the store contract. Subclass it and provide a ``store_url`` fixture."""


# -- child writers: the crash and race cases --------------------------------------------------


def _child(case: StoreCase, store_url: str, *args: str) -> subprocess.Popen[str]:
    """This module run as a writer in a process of its own, with the store class this
    process opens ``store_url`` with registered again there."""
    scheme = store_url.split("://", 1)[0]
    cls = store_class(scheme)
    target = f"{cls.__module__}:{cls.__qualname__}"
    if "<" in target or cls.__module__ == "__main__":
        pytest.skip(f"{target} cannot be imported by a child process: define the store class "
                    "at module level, in a module of its own")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "chatstate.testing.store_contract", scheme, target,
               store_url, "1" if case.allow_ephemeral else "", *args]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _crash(case: StoreCase, store_url: str, cid: str, acks: int, *,
           stall: bool = False) -> list[tuple[int, str]]:
    """Let a writer append to ``cid`` until it acknowledged ``acks`` messages (or, with
    ``stall``, saved one partial reply), then kill it; the (seq, hash) it acknowledged
    (with ``stall``: of the partial reply).

    Out of process: SIGKILL, at whatever instant it is writing. In process: the writer
    (a thread) is stopped and its store object dropped without ``close()``."""
    kind = "partial" if stall else "ack"
    if case.in_process:
        stop = threading.Event()
        said: list[str] = []
        thread = threading.Thread(target=_write_until, daemon=True, args=(
            case.open(store_url), cid, stall, said.append, stop.is_set))
        thread.start()
        deadline = time.monotonic() + 60
        while len(_acks(said, kind)) < acks and time.monotonic() < deadline:
            time.sleep(0.001)
        stop.set()
        thread.join(60)
        return _acks(said, kind)
    child = _child(case, store_url, "crash", cid, "stall" if stall else "")
    said = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            said.append(line)
            if len(_acks(said, kind)) >= acks:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        _, err = child.communicate(timeout=60)
    assert len(_acks(said, kind)) >= acks, f"the child writer stopped early:\n{err}"
    return _acks(said, kind)


def _acks(said: Sequence[str], kind: str = "ack") -> list[tuple[int, str]]:
    """(seq, hash) of every complete ``ack`` (or ``partial``) line a writer said."""
    out = []
    for line in said:
        parts = line.split()
        if line.endswith("\n") and len(parts) == 3 and parts[0] == kind:
            out.append((int(parts[1]), parts[2]))
    return out


def _write_until(store: Store, cid: str, stall: bool, say: Callable[[str], None],
                 stopped: Callable[[], bool]) -> None:
    """Append turns to ``cid`` (a partial reply saved before each reply), saying ``ack seq
    hash`` once each append returned; with ``stall``, save one partial and wait."""
    last = store.load(cid).last
    while not stopped():
        if last is None or last.role == "assistant":
            last = seal_chain(1, last, prefix="child")[0]
            store.append(cid, [last])
            say(f"ack {last.seq} {last.hash}\n")
            continue
        partial = partial_after(last, "part of a reply")
        store.save_partial(cid, partial)
        if stall:
            say(f"partial {partial.seq} {partial.hash}\n")
            while not stopped():
                time.sleep(0.01)
            return
        last = Message.seal(last, role="assistant", content="the reply", turn_id="t-p")
        store.append(cid, [last])
        say(f"ack {last.seq} {last.hash}\n")


def _contend(store: Store, cid: str, n: int, writer: str,
             sealed: Callable[[], None]) -> tuple[list[tuple[int, str]], int]:
    """Append ``n`` messages to ``cid``, reloading and resealing on ConflictError. Calls
    ``sealed`` once its first message is sealed, so that racers seal on one head."""
    acks: list[tuple[int, str]] = []
    conflicts = 0
    msg = seal_chain(1, store.load(cid).last, prefix=writer)[0]
    sealed()
    while len(acks) < n:
        try:
            store.append(cid, [msg])
            acks.append((msg.seq, msg.hash))
        except ConflictError:
            conflicts += 1
        msg = seal_chain(1, store.load(cid).last, prefix=writer)[0]
    return acks, conflicts


def _race(case: StoreCase, store_url: str, cid: str, n: int
          ) -> list[tuple[list[tuple[int, str]], int]]:
    """Two writers of ``n`` messages each, released at once: processes, or threads."""
    if case.in_process:
        barrier = threading.Barrier(2, timeout=60)
        results: list[tuple[list[tuple[int, str]], int]] = []

        def run(writer: str) -> None:
            results.append(_contend(case.open(store_url), cid, n, writer, sealed))

        def sealed() -> None:
            barrier.wait()

        threads = [threading.Thread(target=run, args=(w,)) for w in ("w1", "w2")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(results) == 2, "a racing writer failed"
        return results
    children = [_child(case, store_url, "contend", cid, str(n), w) for w in ("w1", "w2")]
    try:
        for child in children:  # each says "sealed" once its first message is sealed
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line == "sealed\n", line + (child.stderr.read() if child.stderr else "")
        for child in children:  # then release both at once, so that they really race
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outs = [child.communicate(timeout=120) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    for child, (_, err) in zip(children, outs, strict=True):
        assert child.returncode == 0, err
    return [(_acks(out.splitlines(keepends=True)), int(out.rsplit("conflicts ", 1)[1]))
            for out, _ in outs]


def _main(argv: list[str]) -> None:
    scheme, target, url, allow, mode, cid, *rest = argv
    register(scheme, target)
    store = open_store(url, allow_ephemeral=bool(allow))

    def say(line: str) -> None:
        sys.stdout.write(line)
        sys.stdout.flush()

    if mode == "crash":  # until SIGKILLed
        _write_until(store, cid, rest == ["stall"], say, lambda: False)
        return

    def sealed() -> None:
        say("sealed\n")
        if sys.stdin.readline().strip() != "go":
            sys.exit(1)

    acks, conflicts = _contend(store, cid, int(rest[0]), rest[1], sealed)
    say("".join(f"ack {seq} {digest}\n" for seq, digest in acks) + f"conflicts {conflicts}\n")


if __name__ == "__main__":
    _main(sys.argv[1:])
