"""Transcripts written by chatstate 0.1.0 load, verify and take new appends on every store.

The fixtures under tests/fixtures/v0_1/ were written by the 0.1.0 code (commit
5662d16) with tests/fixtures/v0_1/make_fixtures.py: a json store directory, a
sqlite database (schema 3, migrated to 4 here on open) and the objects of an s3
store (uploaded to a fresh moto bucket here). Each holds ``old-plain`` (system,
params, usage, a committed partial, unicode) and ``old-partial`` (a user turn
whose reply was cut off: a stored partial).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import TESTS
from support.richkinds import PNG_1MIB, seal_kind

from chatstate import Chat
from chatstate.core.content import image
from chatstate.stores import open_store
from chatstate.stores.blobs import verify_blobs
from chatstate.testing import FakeModel
from conftest import url_for

FIXTURES = TESTS / "fixtures" / "v0_1"


def _old_hashes() -> dict[str, list[str]]:
    """The hashes 0.1.0 wrote, read straight from its json files."""
    out = {}
    for cid in ("old-plain", "old-partial"):
        doc = json.loads((FIXTURES / "json" / f"{cid}.json").read_text())
        out[cid] = [m["hash"] for m in doc["messages"]]
    return out


@pytest.fixture(params=["json", "sqlite", "s3"])
def old_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param
    if kind == "json":
        shutil.copytree(FIXTURES / "json", tmp_path / "store")
        return f"json://{tmp_path}/store"
    if kind == "sqlite":
        shutil.copyfile(FIXTURES / "store.db", tmp_path / "s.db")
        return f"sqlite://{tmp_path}/s.db"
    url = url_for("s3", tmp_path, request)
    from support.s3server import write_object

    for path in sorted((FIXTURES / "s3").rglob("*")):
        if path.is_file():
            write_object(url, str(path.relative_to(FIXTURES / "s3")), path.read_bytes())
    return url


@pytest.fixture
def old_store(old_store_url: str) -> Iterator[Any]:
    store = open_store(old_store_url)
    try:
        yield store
    finally:
        store.close()


def test_old_transcripts_load_and_verify_unchanged(old_store: Any, old_store_url: str) -> None:
    plain = old_store.load("old-plain")
    assert plain.verify() is None
    assert verify_blobs(old_store, plain) == 0
    assert [m.role for m in plain.messages] == ["system", "user", "assistant", "user",
                                                "assistant", "assistant"]
    assert plain.title == "ünïcode ✓ title"
    assert plain.metadata == {"k": [1, "two"]}
    assert plain.messages[1].content == "Hello, 世界 \u202e"
    assert plain.messages[1].params == {"temperature": 0.2}
    assert plain.messages[2].usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert plain.messages[4].status == "partial"
    assert all(m.tool_calls is None and m.extra is None for m in plain.messages)
    cut = old_store.load("old-partial")
    assert cut.partial is not None
    assert cut.partial.content == "Once upon"
    if old_store_url.startswith("json:"):  # the very hashes 0.1.0 wrote
        hashes = _old_hashes()
        assert [m.hash for m in plain.messages] == hashes["old-plain"]
        assert [m.hash for m in cut.messages] == hashes["old-partial"]
    if old_store_url.startswith("sqlite:"):
        db = sqlite3.connect(old_store.path)
        try:
            from chatstate.stores.sqlite._schema import MIGRATIONS

            # every migration ran, m004_blobs to m010_sealed_binary_rows included
            assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) == 10
        finally:
            db.close()


def test_old_transcripts_take_rich_appends(old_store: Any) -> None:
    conv = old_store.load("old-plain")
    rich = seal_kind(old_store, "image-large", conv.last)
    rich += seal_kind(old_store, "tool-calls", rich[-1])
    rich += seal_kind(old_store, "extra-fields", rich[-1])
    old_store.append("old-plain", rich)
    again = old_store.load("old-plain")
    assert again.messages[:6] == conv.messages
    assert again.messages[6:] == rich
    assert again.verify() is None
    assert verify_blobs(old_store, again) == 1


def test_chat_continues_an_old_conversation_with_an_image(
        old_store: Any, no_model_settings_from_env: None) -> None:
    with FakeModel() as fake:
        chat = Chat(old_store, conversation_id="old-partial", base_url=fake.base_url,
                    model="fake-model", api_key="sk-test-old-data-0123456789")
        assert chat.interrupted is not None
        assert chat.interrupted.partial is not None
        chat.retry()  # 0.1's cut-off reply is kept, the turn completed
        reply = chat.send("and this picture?", attach=[image(PNG_1MIB, name="p.png")])
        parts = fake.request_log[-1]["parts"]
    assert reply.role == "assistant"
    assert "[image/png 1048584 bytes]" in reply.content
    stored = chat.messages[-2].blob_refs()[0]
    # request: user, the completed reply, the new user turn (the cut-off reply is not sent)
    assert parts[-1] == {"message": 2, "role": "user", "type": "image_url",
                         "media_type": "image/png", "size": len(PNG_1MIB),
                         "sha256": stored["sha256"]}
    conv = old_store.load("old-partial")
    assert [m.role for m in conv.messages] == ["user", "assistant", "assistant", "user",
                                               "assistant"]
    assert conv.messages[1].status == "partial"
    assert conv.verify() is None


def test_migrate_copies_old_and_rich_conversations_with_their_blobs(
        old_store: Any, tmp_path: Path) -> None:
    from chatstate.ops.migrate import migrate

    conv = old_store.load("old-plain")
    old_store.append("old-plain", seal_kind(old_store, "image-large", conv.last))
    dst = open_store(f"sqlite://{tmp_path}/copy.db")
    try:
        report = migrate(old_store, dst)
        assert report.ok
        assert report.blobs_copied == 1
        copy = dst.load("old-plain")
        assert copy.messages == old_store.load("old-plain").messages
        assert verify_blobs(dst, copy) == 1
        assert migrate(old_store, dst).blobs_copied == 0  # a rerun copies nothing
    finally:
        dst.close()
