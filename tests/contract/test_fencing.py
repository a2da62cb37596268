"""Fencing, on every store: a write carrying a lease token that is no longer current is refused.

Every write a turn makes (append, partial save, partial clear, header update) carries
``fence``, the owner token of the writer lease it holds. Proves, for each write kind:
the lease holder's fenced write lands; once another writer has taken the lease over
(the first one stalled past its term), the old token's write raises LeaseLost and
nothing is written; a lapsed lease nobody took still fences its writer; a token with
no lease recorded is refused; unfenced writes (migrate, import) work as before. And
the S3 defect of issue 21: a writer whose lease lapsed could still create or replace
the in-progress reply of the writer that took over.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from support.stores import stored_state

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ConflictError, LeaseLost
from chatstate.stores import open_store

WRITES = ["append", "save_partial", "clear_partial", "set_header"]
CID = "c1"


def _mid_reply(store: Any) -> Message:
    """``CID`` with a user message and a partial reply streamed so far; the user message."""
    store.create(Conversation(id=CID, title="before", metadata={"v": 1}))
    user = Message.seal(None, role="user", content="question", turn_id="t1")
    store.append(CID, [user])
    store.save_partial(CID, _partial(user, "streamed so far"))
    return user


def _partial(user: Message, text: str) -> Message:
    return Message.seal(user, role="assistant", content=text, turn_id="t1", status="partial")


def _write(store: Any, kind: str, user: Message, fence: str | None, text: str = "new") -> None:
    if kind == "append":
        store.append(CID, [Message.seal(user, role="assistant", content=text, turn_id="t1")],
                     fence=fence)
    elif kind == "save_partial":
        store.save_partial(CID, _partial(user, text), fence=fence)
    elif kind == "clear_partial":
        store.clear_partial(CID, fence=fence)
    else:
        store.set_header(CID, title=text, metadata={"v": text}, fence=fence)


def _landed(store: Any, kind: str, text: str = "new") -> bool:
    conv = store.load(CID)
    if kind == "append":
        return len(conv.messages) == 2 and conv.messages[1].content == text
    if kind == "save_partial":
        return conv.partial is not None and conv.partial.content == text
    if kind == "clear_partial":
        return conv.partial is None
    return (conv.title, conv.metadata) == (text, {"v": text})


def _state(url: str, store: Any) -> tuple[Any, dict[str, bytes]]:
    conv = store.load(CID)
    return (conv.messages, conv.partial, conv.title, conv.metadata), stored_state(url, store)


def _taken_over(store_url: str) -> tuple[Any, Any, Any, Any, Message]:
    """Writer A's lease lapsed and writer B took it: A's store and lease, B's, the user
    message."""
    a, b = open_store(store_url), open_store(store_url)
    user = _mid_reply(a)
    lease_a = a.acquire_lease(CID, term=0.3)
    time.sleep(0.6)
    return a, lease_a, b, b.acquire_lease(CID, term=60), user


@pytest.mark.parametrize("kind", WRITES)
def test_a_write_fenced_by_the_lease_holder_lands(store: Any, kind: str) -> None:
    user = _mid_reply(store)
    lease = store.acquire_lease(CID, term=60)
    _write(store, kind, user, lease.owner)
    assert _landed(store, kind)


@pytest.mark.invariant(5)
@pytest.mark.parametrize("kind", WRITES)
def test_a_write_fenced_by_a_lost_lease_is_refused_and_writes_nothing(
        store_url: str, kind: str) -> None:
    a, lease_a, b, _, user = _taken_over(store_url)
    before = _state(store_url, b)
    with pytest.raises(LeaseLost) as info:
        _write(a, kind, user, lease_a.owner)
    assert isinstance(info.value, ConflictError)
    assert info.value.fence == lease_a.owner
    assert "another writer" in str(info.value)
    assert repr(CID) in str(info.value)
    assert _state(store_url, b) == before
    assert not _landed(b, kind)


@pytest.mark.parametrize("kind", WRITES)
def test_the_writer_that_took_over_writes_on(store_url: str, kind: str) -> None:
    _, _, b, lease_b, user = _taken_over(store_url)
    _write(b, kind, user, lease_b.owner)
    assert _landed(b, kind)


@pytest.mark.parametrize("kind", WRITES)
def test_a_lapsed_lease_nobody_took_still_fences_its_writer(store: Any, kind: str) -> None:
    user = _mid_reply(store)
    lease = store.acquire_lease(CID, term=0.2)
    time.sleep(0.4)
    _write(store, kind, user, lease.owner)
    assert _landed(store, kind)


@pytest.mark.parametrize("kind", WRITES)
def test_a_fence_with_no_lease_recorded_is_refused(store_url: str, kind: str) -> None:
    """A token this store never recorded, or one whose lease was released: not provably the
    writer's, so refused rather than trusted."""
    store = open_store(store_url)
    user = _mid_reply(store)
    store.release_lease(store.acquire_lease(CID, term=60))
    before = _state(store_url, store)
    with pytest.raises(LeaseLost, match="holds no lease"):
        _write(store, kind, user, "a-token-never-issued")
    assert _state(store_url, store) == before


@pytest.mark.parametrize("kind", WRITES)
def test_unfenced_writes_work_as_before_whoever_holds_the_lease(
        store_url: str, kind: str) -> None:
    a, _, b, _, user = _taken_over(store_url)
    _write(a, kind, user, None)
    assert _landed(b, kind)


@pytest.mark.invariant(5)
def test_a_stale_streamer_cannot_replace_the_partial_of_the_writer_that_took_over(
        store_url: str) -> None:
    """Issue 21, item 1 (seen on S3): writer A streams a reply under its lease; it stalls
    past its term; B takes the lease over and streams its own reply into the partial slot.
    A's next flush, clear and commit are refused, and B's partial is intact."""
    a, b = open_store(store_url), open_store(store_url)
    user = _mid_reply(a)
    lease_a = a.acquire_lease(CID, term=0.4)
    for n in range(1, 4):
        a.save_partial(CID, _partial(user, "A" * n), fence=lease_a.owner)
    time.sleep(0.8)
    lease_b = b.acquire_lease(CID, term=60)
    b.save_partial(CID, _partial(user, "B's reply"), fence=lease_b.owner)
    with pytest.raises(LeaseLost):
        a.save_partial(CID, _partial(user, "AAAA"), fence=lease_a.owner)
    conv = b.load(CID)
    assert conv.partial is not None
    assert conv.partial.content == "B's reply"
    b.save_partial(CID, _partial(user, "B's reply, longer"), fence=lease_b.owner)
    for stale in (lambda: a.clear_partial(CID, fence=lease_a.owner),
                  lambda: a.append(CID, [Message.seal(user, role="assistant", content="AAAA",
                                                      turn_id="t1")], fence=lease_a.owner)):
        with pytest.raises(LeaseLost):
            stale()
    conv = b.load(CID)
    assert len(conv.messages) == 1
    assert conv.partial is not None
    assert conv.partial.content == "B's reply, longer"


@pytest.mark.invariant(5)
def test_a_takeover_racing_a_stale_streamer_stops_it_and_keeps_the_new_reply(
        store_url: str) -> None:
    """A streams flat out and never renews; B takes the lapsed lease over mid-stream and
    saves its partial. Whatever instant the takeover lands at, A is stopped by LeaseLost
    and nothing A wrote replaces B's partial."""
    a, b = open_store(store_url), open_store(store_url)
    user = _mid_reply(a)
    lease_a = a.acquire_lease(CID, term=0.3)
    stopped: list[BaseException] = []

    def stream() -> None:
        n = 0
        while n < 100_000:
            n += 1
            try:
                a.save_partial(CID, _partial(user, f"A {n}"), fence=lease_a.owner)
            except ConflictError as exc:
                stopped.append(exc)
                return

    thread = threading.Thread(target=stream)
    thread.start()
    time.sleep(0.6)
    lease_b = b.acquire_lease(CID, term=60)
    b.save_partial(CID, _partial(user, "B's reply"), fence=lease_b.owner)
    thread.join(60)
    assert len(stopped) == 1, stopped
    assert isinstance(stopped[0], LeaseLost), stopped
    conv = b.load(CID)
    assert conv.partial is not None
    assert conv.partial.content == "B's reply"


@pytest.mark.parametrize("store_url", ["s3"], indirect=True)
def test_s3_a_fenced_flush_never_replaces_a_partial_it_did_not_write(store_url: str) -> None:
    """The partial PUT is conditional on the e-tag of the partial this writer last wrote:
    a partial another writer put after this writer's lease check (the window S3 leaves
    between reading the lease and writing) is never overwritten."""
    a, other = open_store(store_url), open_store(store_url)
    user = _mid_reply(a)
    lease = a.acquire_lease(CID, term=60)
    a.save_partial(CID, _partial(user, "mine"), fence=lease.owner)
    other.save_partial(CID, _partial(user, "put by another writer"))  # unfenced: lands
    with pytest.raises(ConflictError, match="replaced this partial"):
        a.save_partial(CID, _partial(user, "mine, longer"), fence=lease.owner)
    conv = other.load(CID)
    assert conv.partial is not None
    assert conv.partial.content == "put by another writer"

