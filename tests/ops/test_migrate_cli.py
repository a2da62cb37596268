"""`chatstate migrate` through the real entry point: copy, rerun, and a divergent destination."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from chatstate.core.transcript import Conversation, Message
from chatstate.stores import open_store

CLI = [sys.executable, "-m", "chatstate"]


def chatstate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def conversation(url: str, cid: str, *texts: str) -> list[str]:
    store = open_store(url)
    store.create(Conversation(id=cid, title=cid))
    prev, hashes = None, []
    for text in texts:
        prev = Message.seal(prev, role="user", content=text, turn_id=f"t{len(hashes)}")
        store.append(cid, [prev])
        hashes.append(prev.hash)
    store.close()
    return hashes


def test_migrate_copies_then_skips_then_reports_a_divergent_destination(tmp_path: Path) -> None:
    src, dst = f"json://{tmp_path}/src", f"sqlite://{tmp_path}/dst.db"
    hashes = {"a": conversation(src, "a", "one", "two"), "b": conversation(src, "b", "three")}

    first = chatstate("migrate", "--from", src, "--to", dst, "--json")
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert sorted(report["copied"]) == ["a", "b"]
    assert report["ok"] is True
    copied = open_store(dst)
    assert {cid: [m.hash for m in copied.load(cid).messages] for cid in hashes} == hashes
    copied.close()

    again = chatstate("migrate", "--from", src, "--to", dst, "--json")
    assert again.returncode == 0, again.stderr
    assert sorted(json.loads(again.stdout)["skipped"]) == ["a", "b"]

    conversation(dst, "c", "the destination's own")
    conversation(src, "c", "something else")
    clash = chatstate("migrate", "--from", src, "--to", dst)
    assert clash.returncode == 1
    assert "c" in clash.stderr
    assert "CONFLICT" in clash.stderr
    assert "Traceback" not in clash.stderr
    kept = open_store(dst)
    assert [m.content for m in kept.load("c").messages] == ["the destination's own"]


def test_migrate_from_a_store_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    done = chatstate("migrate", "--from", f"json://{missing}", "--to", f"sqlite://{tmp_path}/d.db")
    assert done.returncode == 1
    assert "does not exist" in done.stderr
    assert not missing.exists()
    assert not (tmp_path / "d.db").exists()
