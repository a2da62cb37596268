"""`chatstate gc`: blobs no message names are removed, nothing any message names ever is.

On every store: a deleted conversation's attachment goes, one another conversation
(or a partial reply) still names stays; a blob stored within the grace period
stays, and storing a blob again makes it young; a dry run removes nothing; a
damaged conversation stops the sweep before anything is removed.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import invoke
from support.stores import seal_chain

from chatstate.core.content import image, store_parts
from chatstate.core.transcript import Conversation, Message
from chatstate.errors import ChatstateError
from chatstate.ops.blobgc import collect_blobs
from chatstate.stores import CollectsBlobs, open_store


def picture(tag: str) -> bytes:
    """An image large enough to go into the blob area, distinct per tag."""
    return b"\x89PNG\r\n\x1a\n" + hashlib.sha256(tag.encode()).digest() * 4096


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def with_image(store: Any, cid: str, data: bytes, *, partial: bool = False) -> None:
    """Create ``cid``: a user message naming ``data`` (or a partial reply naming it)."""
    store.create(Conversation(id=cid))
    content = store_parts(store, [image(data, name=f"{cid}.png")])
    if partial:
        first = seal_chain(1, prefix=cid)
        store.append(cid, first)
        store.save_partial(cid, Message.seal(first[-1], role="assistant", content=content,
                                             turn_id="t-1", status="partial"))
    else:
        store.append(cid, [Message.seal(None, role="user", content=content, turn_id="t-1")])


@pytest.fixture
def gc_store(store_url: str) -> Any:
    store = open_store(store_url)
    yield store
    store.close()


def held(store: Any) -> set[str]:
    return {digest for digest, _, _ in store.list_blobs()}


def test_every_store_can_sweep_its_blobs(gc_store: Any) -> None:
    assert isinstance(gc_store, CollectsBlobs)


def test_a_deleted_conversations_image_goes_and_named_ones_stay(gc_store: Any,
                                                                store_url: str) -> None:
    kept, gone, shared, cut = picture("kept"), picture("gone"), picture("shared"), \
        picture("cut")
    with_image(gc_store, "a", kept)
    with_image(gc_store, "b", gone)
    with_image(gc_store, "c", shared)
    with_image(gc_store, "d", shared)
    with_image(gc_store, "e", cut, partial=True)
    gc_store.delete("b")
    gc_store.delete("c")  # its image is still named by d
    sweep = collect_blobs(gc_store, grace=0)
    assert sweep.removed == [sha(gone)]
    assert sweep.freed == len(gone)
    assert (sweep.held, sweep.named, sweep.young) == (4, 3, [])
    assert held(gc_store) == {sha(kept), sha(shared), sha(cut)}
    fresh = open_store(store_url)  # and what is named still loads, digests checked
    try:
        for cid, data in (("a", kept), ("d", shared)):
            digest = fresh.load(cid).messages[0].blob_refs()[0]["sha256"]
            assert fresh.get_blob(digest) == data
        assert fresh.load("e").partial is not None
        assert fresh.get_blob(sha(cut)) == cut
    finally:
        fresh.close()


def test_young_blobs_stay_and_storing_again_makes_a_blob_young(gc_store: Any) -> None:
    """A blob stored but not yet named (a writer between put_blob and append) is kept for
    the grace period; putting it again renews it."""
    early, late = picture("early"), picture("late")
    # S3's Last-Modified has whole seconds (an age reads up to 1 s high), and a loaded
    # machine may take a second between a put and the listing: margins for both
    gc_store.put_blob(early, media_type="image/png")
    time.sleep(3.2)
    gc_store.put_blob(late, media_type="image/png")
    sweep = collect_blobs(gc_store, grace=3.0, dry_run=True)
    assert (sweep.removed, sweep.young) == ([sha(early)], [sha(late)])
    gc_store.put_blob(early, media_type="image/png")  # a writer about to name it again
    sweep = collect_blobs(gc_store, grace=3.0)
    assert sweep.removed == []
    assert sorted(sweep.young) == sorted([sha(early), sha(late)])
    assert held(gc_store) == {sha(early), sha(late)}


def test_a_dry_run_removes_nothing(gc_store: Any) -> None:
    gc_store.put_blob(picture("orphan"), media_type="image/png")
    sweep = collect_blobs(gc_store, grace=0, dry_run=True)
    assert sweep.removed == [sha(picture("orphan"))]
    assert sweep.dry_run
    assert held(gc_store) == {sha(picture("orphan"))}


@pytest.mark.invariant(6)
def test_a_damaged_conversation_stops_the_sweep_before_anything_is_removed(
        tmp_path: Path) -> None:
    url = f"json://{tmp_path}/store"
    store = open_store(url)
    try:
        with_image(store, "ok", picture("ok"))
        store.put_blob(picture("orphan"), media_type="image/png")
        (tmp_path / "store" / "ok.json").write_text("{ not json", encoding="utf-8")
        with pytest.raises(ChatstateError, match="ok"):
            collect_blobs(store, grace=0)
        assert held(store) == {sha(picture("ok")), sha(picture("orphan"))}
    finally:
        store.close()


def test_the_cli_is_a_dry_run_unless_yes(tmp_path: Path) -> None:
    store_url = f"sqlite://{tmp_path}/s.db"  # the CLI is one on every store
    store = open_store(store_url)
    try:
        with_image(store, "a", picture("a"))
        with_image(store, "b", picture("b"))
        store.delete("b")
    finally:
        store.close()
    dry = invoke(["gc", "--grace", "0s", "--force"], store=store_url)
    assert dry.code == 0, dry.err
    assert f"would remove blob {sha(picture('b'))}" in dry.out
    assert "1 of 2 blob(s) unnamed" in dry.err
    assert "add --yes" in dry.err
    done = invoke(["gc", "--grace", "0s", "--force", "--yes"], store=store_url)
    assert f"removed blob {sha(picture('b'))}" in done.out
    again = invoke(["gc", "--grace", "0s", "--force", "--yes"], store=store_url)
    assert "0 of 1 blob(s) removed" in again.err
    assert "1 named by a message" in again.err


class WriterDuringSweep:
    """The real store, with a second thread committing a message that names a blob
    (stored just before the sweep) while the sweep reads the conversations."""

    def __init__(self, store: Any, data: bytes) -> None:
        self._store, self._data, self._done = store, data, False
        self.content = store_parts(store, [image(data, name="late.png")])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def list_conversations(self) -> Any:
        listing = self._store.list_conversations()
        if not self._done:
            self._done = True
            writer = threading.Thread(target=lambda: with_content(self._store, self.content))
            writer.start()
            writer.join()
        return listing


def with_content(store: Any, content: Any) -> None:
    store.create(Conversation(id="late"))
    store.append("late", [Message.seal(None, role="user", content=content, turn_id="t-1")])


@pytest.mark.parametrize("kind", ["json", "sqlite"])
def test_a_message_committed_during_the_sweep_keeps_its_blob(tmp_path: Path, kind: str) -> None:
    url = f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    try:
        with_image(store, "gone", picture("gone"))
        store.delete("gone")
        racing = WriterDuringSweep(store, picture("late"))
        sweep = collect_blobs(racing, grace=0)
        assert sha(picture("late")) in held(store)
        assert sha(picture("late")) not in sweep.removed
        assert sweep.removed == [sha(picture("gone"))]
        assert store.load("late").messages  # the conversation loads
        assert collect_blobs(store, grace=0).removed == []  # and gc runs again
    finally:
        store.close()


@pytest.mark.parametrize("grace", ["0", "0s", "5m", "599s"])
def test_the_cli_refuses_a_grace_shorter_than_a_turn_unless_forced(tmp_path: Path,
                                                                   grace: str) -> None:
    store_url = f"sqlite://{tmp_path}/s.db"
    refused = invoke(["gc", "--grace", grace], store=store_url)
    assert refused.code == 2
    assert "--grace" in refused.err and "--force" in refused.err
    forced = invoke(["gc", "--grace", grace, "--force"], store=store_url)
    assert forced.code == 0, forced.err


@pytest.mark.parametrize("grace", ["10m", "1h", "2d", "600s"])
def test_the_cli_takes_a_grace_of_a_turn_or_more(tmp_path: Path, grace: str) -> None:
    done = invoke(["gc", "--grace", grace], store=f"sqlite://{tmp_path}/s.db")
    assert done.code == 0, done.err


@pytest.mark.parametrize("grace", ["ten", "1x", "-1h", "5"])
def test_the_cli_names_a_grace_it_cannot_read(tmp_path: Path, grace: str) -> None:
    bad = invoke(["gc", "--grace", grace, "--force"], store=f"sqlite://{tmp_path}/s.db")
    assert bad.code == 2
    assert "--grace" in bad.err and repr(grace) in bad.err
