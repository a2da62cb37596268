"""The store contract, once, for every store: the shipped suite on the built-in stores and
memory://, then the cases only the built-in stores can be held to.

``chatstate.testing.store_contract`` holds the contract (create/load/list/delete,
compare-and-append, partials, header, open records, ``check()``, crash/reopen with a
SIGKILLed writer, two racing writers, leases and fencing, blobs, damage refusal), and a
store joins it by subclassing ``StoreContract`` with a ``store_url`` fixture, exactly
as below. Here, besides: ids that could escape the store touch no file; a document
from a newer chatstate is refused and left alone; damage stays byte for byte as it
was, seen through a writer's own cache too.
"""

from __future__ import annotations

import functools
import secrets
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.stores import (
    DamageHooks,
    local_path,
    scheme,
    snapshot,
    stored_state,
    tamper,
)

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import CorruptTranscriptError, InvalidConversationId, SchemaVersionError
from chatstate.stores import open_store
from chatstate.stores.memory.store import MemoryStore
from chatstate.testing.store_contract import (
    RewriteCases,
    StoreContract,
    new_conversation,
    seal_chain,
)
from conftest import url_for


class TestBuiltinStores(DamageHooks, StoreContract):
    """json, sqlite, s3 (moto) and postgresql (the test server): conftest's ``store_url``."""


class TestRewritingStores(RewriteCases):
    """The optional in-place rewrite (``Rewrites``, what ``rekey`` needs) on every built-in
    store: json, sqlite, postgresql and s3 (moto; SeaweedFS in test_s3_seaweed.py)."""

    @pytest.fixture(params=["json", "sqlite", "postgresql", "s3"])
    def store_url(self, request: pytest.FixtureRequest, tmp_path: Path) -> str:
        return url_for(request.param, tmp_path, request)


class TestMemoryStore(RewriteCases, StoreContract):
    """memory://, the reference store: in this process, so allowed as ephemeral here."""

    allow_ephemeral = True
    in_process = True

    @pytest.fixture
    def store_url(self) -> str:
        return f"memory://contract-{secrets.token_hex(6)}"

    def _space(self, store_url: str) -> Any:
        return MemoryStore.from_url(store_url).space

    def damage(self, store_url: str, conversation_id: str, seq: int) -> None:
        held = self._space(store_url).conversations[conversation_id]
        messages = list(held.messages)
        messages[seq] = messages[seq].model_copy(update={"content": f"msg {seq}, edited"})
        held.messages = tuple(messages)

    def damage_blob(self, store_url: str, sha256: str, how: str) -> None:
        blobs = self._space(store_url).blobs
        data, stored_at = blobs[sha256]
        blobs[sha256] = (data[:1000] if how == "truncated" else b"X" + data[1:], stored_at)


# The shipped cases carry no marker of this project's (a third party's pytest would not
# know it); here, on the built-in stores and memory://, they are the proofs of these.
PROOFS = {
    "test_stale_expected_seq_conflicts_and_writes_nothing": (5,),
    "test_message_chained_off_stale_last_hash_conflicts": (5,),
    "test_conflict_leaves_partial_alone": (5,),
    "test_retried_append_never_duplicates": (5,),
    "test_two_writers_racing_lose_nothing": (5,),
    "test_partial_for_wrong_seq_conflicts": (5,),
    "test_a_fenced_write_after_a_takeover_is_refused": (5,),
    "test_a_killed_writer_loses_nothing_acknowledged": (3, 4),
    "test_the_partial_reply_of_a_killed_writer_survives": (7,),
    "test_writes_onto_a_chain_that_does_not_verify_are_refused": (6,),
    "test_a_damaged_blob_is_named_and_never_overwritten": (6,),
}


def _proof(case: Callable[..., None], numbers: tuple[int, ...]) -> Callable[..., None]:
    @functools.wraps(case)
    def proof(*args: Any, **kwargs: Any) -> None:
        case(*args, **kwargs)

    return pytest.mark.invariant(*numbers)(proof)  # a new function: the shipped one stays bare


for _cls in (TestBuiltinStores, TestMemoryStore):
    for _name, _numbers in PROOFS.items():
        setattr(_cls, _name, _proof(getattr(StoreContract, _name), _numbers))


# -- only the built-in stores ------------------------------------------------------------


def test_check_leaves_no_probe_file(tmp_path: Path) -> None:
    store = open_store(f"json://{tmp_path}/s")
    assert store.check().ok
    assert not list((tmp_path / "s" / ".chatstate").glob("*probe*"))
    store.close()


BAD_IDS = {"slash": "a/b", "parent": "../escape", "dotdot": "..", "nul": "x\0y",
           "backslash": "a\\b", "absolute": "/abs", "newline": "a\nb"}


@pytest.mark.parametrize("bad", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_invalid_ids_are_refused_before_any_io(local_store_url: str, tmp_path: Path,
                                               bad: str) -> None:
    store = open_store(local_store_url)
    new_conversation(store, "ok", 1)
    before = set(tmp_path.rglob("*"))
    msg = seal_chain(1)[0]
    calls: list[Callable[[], Any]] = [
        lambda: store.create(Conversation(id=bad)), lambda: store.load(bad),
        lambda: store.append(bad, [msg]), lambda: store.save_partial(bad, msg),
        lambda: store.clear_partial(bad), lambda: store.set_header(bad, title="t"),
        lambda: store.delete(bad)]
    for call in calls:
        with pytest.raises(InvalidConversationId):
            call()
    assert set(tmp_path.rglob("*")) - before == set()
    assert not (tmp_path.parent / "escape.json").exists()
    store.close()


# -- schema versions -----------------------------------------------------------------------


def _from_the_future(url: str, cid: str) -> None:
    """Rewrite the stored document of ``cid`` as if a newer chatstate had written it."""
    kind = scheme(url)
    if kind == "json":
        path = local_path(url) / f"{cid}.json"
        raw = path.read_bytes()
        assert raw.startswith(b'{"schema":1,')
        path.write_bytes(b'{"schema":99,' + raw[len(b'{"schema":1,'):])
    elif kind == "sqlite":
        with sqlite3.connect(local_path(url)) as db:
            db.execute("PRAGMA user_version=99")
        db.close()
    else:
        raise AssertionError(f"no raw access to {kind} documents here")


@pytest.mark.invariant(6)
def test_schema_from_the_future_is_refused_and_untouched(local_store_url: str) -> None:
    # Local stores only: the s3 variant (a segment rewritten with schema 99, refused and
    # left as it is) is in test_s3_store.py::test_tampered_message_is_named_and_left_alone.
    store_url = local_store_url
    store = open_store(store_url)
    new_conversation(store, "c1", 2)
    store.close()
    _from_the_future(store_url, "c1")
    path = local_path(store_url)
    before = snapshot(path)
    if scheme(store_url) == "sqlite":  # one schema for the whole database: open refuses
        with pytest.raises(SchemaVersionError) as opening:
            open_store(store_url)
        refusals = [opening.value]
    else:  # one schema per conversation file: the store opens, the conversation is refused
        store = open_store(store_url)
        try:
            with pytest.raises(SchemaVersionError) as loading:
                store.load("c1")
            with pytest.raises(SchemaVersionError) as appending:
                store.append("c1", seal_chain(3)[2:])
        finally:
            store.close()
        refusals = [loading.value, appending.value]
    for refusal in refusals:
        text = str(refusal)
        assert str(path) in text, text
        assert "99" in text, text
        assert "upgrade chatstate" in text, text
    after = snapshot(path)
    key = path.name if path.is_file() else "c1.json"
    assert after[key] == before[key]


# -- damage is never written over --------------------------------------------------------


@pytest.mark.invariant(6)
def test_a_damaged_chain_stays_byte_for_byte_as_it_was(store_url: str) -> None:
    """The shipped case proves the refusal; here the stored bytes are compared too, and
    the writer that wrote the chain (its cache warm) refuses as well as a fresh one."""
    store = open_store(store_url)
    msgs = new_conversation(store, "c1", 3)
    tamper(store_url, store, "c1", 1)
    before = stored_state(store_url, store)
    writers = [open_store(store_url)]  # another process, nothing cached
    # local stores also see it through their own cache; shared ones (s3, postgresql)
    # re-verify when the head moved, and a fresh writer always verifies
    if scheme(store_url) not in ("s3", "postgresql"):
        writers.append(store)
    for writer in writers:
        writes: dict[str, Callable[[], Any]] = {
            "append": lambda w=writer: w.append("c1", seal_chain(1, msgs[-1])),
            "save_partial": lambda w=writer: w.save_partial("c1", Message.seal(
                msgs[-1], role="user", content="half", turn_id="t-1", status="partial")),
            "set_header": lambda w=writer: w.set_header("c1", title="renamed"),
        }
        for name, write in writes.items():
            with pytest.raises(CorruptTranscriptError) as info:
                write()
            assert info.value.position == 1, (name, str(info.value))
        assert stored_state(store_url, store) == before
    for writer in writers:
        writer.close()
