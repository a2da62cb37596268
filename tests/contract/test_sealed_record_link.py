"""A sealed record's link to the stored chain is hashed once: ``_seal`` makes its hash
as the chain hash of its canonical body after the stored hash before it, and the inner
store's check of that link (``expected_hash``, ``PreparedBatch``) takes it from there
instead of hashing the body again. Anything else is hashed as ever: another link, a
copy, a record edited after sealing."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.sealed import KEY

from chatstate.core import transcript
from chatstate.core.canonical import chain_hash
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ConflictError, CorruptTranscriptError
from chatstate.stores import open_store
from chatstate.stores.base import PreparedBatch
from chatstate.stores.codec import parse_key
from chatstate.stores.sealed import SealedStore


@pytest.fixture
def sealed(tmp_path: Path) -> SealedStore:
    store = open_store(f"sqlite://{tmp_path}/s.db", key=parse_key(KEY, "test"))
    assert isinstance(store, SealedStore)
    store.create(Conversation(id="c"))
    return store


def _hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    monkeypatch.setattr(transcript, "chain_hash", lambda prev, body: made.append(body) or
                        chain_hash(prev, body))
    return made


def test_the_link_seal_made_is_not_hashed_again(sealed: SealedStore,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    first = Message.seal(None, role="user", content="hello", turn_id="t")
    record = sealed._seal("c", first, "stored-before", None)
    made = _hashes(monkeypatch)
    assert record.expected_hash("stored-before") == record.hash \
        == chain_hash("stored-before", record.body())
    assert PreparedBatch([record]).first_break("stored-before", 0) is None
    assert made == []  # neither check hashed the 1 KB body again
    # another link is hashed, and is not the record's
    assert record.expected_hash("another") == chain_hash("another", record.body())
    assert PreparedBatch([record]).first_break("another", 0) == 0
    assert len(made) == 2


def test_a_copy_or_an_edited_record_is_hashed_and_refused(
        sealed: SealedStore, monkeypatch: pytest.MonkeyPatch) -> None:
    first = Message.seal(None, role="user", content="hello", turn_id="t")
    record = sealed._seal("c", first, None, None)
    edited = record.model_copy(update={"status": "partial"})  # a copy keeps no link
    made = _hashes(monkeypatch)
    assert edited.expected_hash(None) != edited.hash
    assert made  # hashed
    with pytest.raises(CorruptTranscriptError, match="does not chain"):
        sealed.inner.append("c", [edited])
    assert sealed.inner.load("c").messages == []
    sealed.inner.append("c", [record])  # the record as sealed goes in
    second = sealed._seal("c", Message.seal(first, role="assistant", content="hi",
                                            turn_id="t"), "not-the-stored-hash", first.hash)
    with pytest.raises(ConflictError):  # sealed after another stored hash: not its link
        sealed.inner.append("c", [second])
    assert [m.hash for m in sealed.inner.load("c").messages] == [record.hash]
