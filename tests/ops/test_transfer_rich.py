"""Export, import and replay of rich transcripts: every content kind, every form.

Proves: a chatstate export carries the blobs its messages name and imports back
with identical messages (hashes) and blobs on every store; the OpenAI messages
form (JSON list and jsonl) inlines blobs as data URLs and round-trips
identically, its large parts going back into the blob area; `replay` shows tool
calls, results, statuses, images and files readably in text and markdown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cli_helpers import invoke
from support.richkinds import KINDS, PNG_1MIB, seal_kind
from support.stores import new_conversation

from chatstate.core.content import image
from chatstate.ops.transfer import export_json, export_openai, import_into, read_import
from chatstate.stores import open_store
from chatstate.stores.blobs import verify_blobs


def _fill(store: Any, kind: str) -> None:
    prev = new_conversation(store, "c1", 2)[-1]
    store.append("c1", seal_kind(store, kind, prev))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_chatstate_export_round_trips_every_kind(store: Any, kind: str, tmp_path: Path) -> None:
    _fill(store, kind)
    conv = store.load("c1")
    path = tmp_path / "c1.export.json"
    path.write_text(export_json(conv, store))
    imported = read_import(path)
    imported.conversation.id = "c2"
    other = open_store(f"json://{tmp_path}/other")
    try:
        import_into(other, imported)
        again = other.load("c2")
        assert again.messages == conv.messages
        assert again.verify() is None
        assert verify_blobs(other, again) == verify_blobs(store, conv)
    finally:
        other.close()


@pytest.mark.parametrize("jsonl", [False, True], ids=["json", "jsonl"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_openai_export_round_trips_identically(local_store_url: str, kind: str, jsonl: bool,
                                               tmp_path: Path) -> None:
    store = open_store(local_store_url)
    other = open_store(f"sqlite://{tmp_path}/other.db")
    try:
        _fill(store, kind)
        first = export_openai(store.load("c1"), store, jsonl=jsonl)
        path = tmp_path / ("m.jsonl" if jsonl else "m.json")
        path.write_text(first)
        imported = read_import(path)
        import_into(other, imported)
        conv = other.load(imported.conversation.id)
        assert export_openai(conv, other, jsonl=jsonl) == first
        assert conv.verify() is None
        if kind in ("image-large", "file"):  # large data went back into the blob area
            assert verify_blobs(other, conv) == 1
            assert "data:" not in json.dumps([m.stored() for m in conv.messages])
        if kind == "image-large":
            lines = first.splitlines() if jsonl else [json.dumps(m) for m in json.loads(first)]
            assert image(PNG_1MIB)["image_url"]["url"] in lines[-1]
    finally:
        store.close()
        other.close()


def test_replay_shows_tools_images_and_files(tmp_path: Path) -> None:
    url = f"json://{tmp_path}/s"
    store = open_store(url)
    try:
        _fill(store, "tool-calls")
        prev = store.load("c1").last
        for kind in ("image-large", "file", "image-url", "image-small", "unknown-part"):
            rich = seal_kind(store, kind, prev)
            store.append("c1", rich)
            prev = rich[-1]
        sha = store.load("c1").messages[7].blob_refs()[0]["sha256"]
    finally:
        store.close()
    out = invoke(["replay", "c1"], store=url)
    assert out.code == 0, out.err
    lines = out.out.splitlines()
    assert "[3] assistant: → get_weather({\"city\":\"Oslo\"})" in lines
    assert "[4] tool get_weather [call_1]: rain, 4 C" in lines
    assert "[5] tool [call_2] (error): boom" in lines
    assert "[6] tool [call_3] (outcome unknown): interrupted" in lines
    assert f"[7] user: big [image: big.png, 1 MiB, sha256 {sha}]" in lines
    assert any(line.startswith("[8] user: [file: report.pdf, 100 KiB, sha256 ") for line in lines)
    assert "[9] user: look [image: https://example.invalid/cat.png]" in lines
    assert "[10] user: [image: image/png, 308 B, inline]" in lines
    assert "[11] user: [input_audio part] [x-future part]" in lines
    markdown = invoke(["replay", "c1", "--format", "markdown"], store=url).out
    assert "**tool get_weather [call_1]** · seq 4\n\nrain, 4 C" in markdown
    assert f"[image: big.png, 1 MiB, sha256 {sha}]" in markdown
    doc = invoke(["replay", "c1", "--format", "json"], store=url).json()
    assert doc["schema"] == 2
    assert doc["messages"][7]["content"][1]["blob"]["sha256"] == sha
    verified = invoke(["replay", "c1", "--verify"], store=url)
    assert verified.code == 0
    assert "verified: 12 messages" in verified.err
    assert "1 MiB" not in str(len(out.out))  # the image's bytes are never printed
    assert len(out.out) < 4096


def test_cli_export_import_carries_blobs(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    try:
        new_conversation(store, "c1")
        store.append("c1", seal_kind(store, "image-large"))
    finally:
        store.close()
    for fmt in ("chatstate", "openai", "jsonl"):
        path = tmp_path / f"out.{fmt}"
        assert invoke(["export", "c1", "-o", str(path), "--format", fmt], store=url).code == 0
        target = f"json://{tmp_path}/t-{fmt}"
        result = invoke(["import", str(path)], store=target)
        assert result.code == 0, result.err
        cid = result.out.strip()
        replay = invoke(["replay", cid, "--verify"], store=target)
        assert replay.code == 0, replay.err
        assert "[image: " in replay.out, replay.err
        assert len(list((tmp_path / f"t-{fmt}" / "blobs").iterdir())) == 1


def test_replay_verify_reports_an_altered_blob(tmp_path: Path) -> None:
    url = f"json://{tmp_path}/s"
    store = open_store(url)
    try:
        new_conversation(store, "c1")
        store.append("c1", seal_kind(store, "image-large"))
        sha = store.load("c1").messages[0].blob_refs()[0]["sha256"]
    finally:
        store.close()
    blob = tmp_path / "s" / "blobs" / sha
    blob.write_bytes(b"Y" + blob.read_bytes()[1:])
    result = invoke(["replay", "c1", "--verify"], store=url)
    assert result.code == 1
    assert str(blob) in result.err
    assert "altered" in result.err
    assert invoke(["replay", "c1"], store=url).code == 0  # without --verify: sizes only


def test_import_refuses_an_export_missing_a_blob(tmp_path: Path) -> None:
    url = f"json://{tmp_path}/s"
    store = open_store(url)
    try:
        new_conversation(store, "c1")
        store.append("c1", seal_kind(store, "image-large"))
        doc = json.loads(export_json(store.load("c1"), store))
    finally:
        store.close()
    doc["blobs"] = {}
    path = tmp_path / "e.json"
    path.write_text(json.dumps(doc))
    result = invoke(["import", str(path), "--id", "c2"], store=url)
    assert result.code == 1
    assert "is missing" in result.err
    assert str(path) in result.err
    assert [r["id"] for r in invoke(["list", "--json"], store=url).json()] == ["c1"]
