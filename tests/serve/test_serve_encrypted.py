"""serve on an encrypted store (issue 25): turns are stored sealed, listing works, and
?q= is refused with a 400 that says why (no full-text search on an encrypted store)."""

from __future__ import annotations

from pathlib import Path

import httpx2
from support.sealed import KEY, open_raw
from support.serve_helpers import ServeProcess, local_url, serve_env

from chatstate.testing import FakeModel


def test_serve_stores_turns_sealed_and_refuses_search(tmp_path: Path) -> None:
    url = local_url("sqlite", tmp_path)
    with FakeModel(reply_words=3) as fake, \
            ServeProcess(url, fake.base_url,
                         serve_env(tmp_path, CHATSTATE_ENCRYPTION_KEY=KEY)) as proxy:
        r = httpx2.post(proxy.base_url + "/chat/completions", timeout=30, json={
            "model": "m", "messages": [{"role": "user", "content": "sealed words 41c9"}]})
        assert r.status_code == 200, r.text
        listed = httpx2.get(proxy.base_url + "/chatstate/conversations", timeout=30)
        assert listed.status_code == 200, listed.text
        assert len(listed.json()["data"]) == 1
        searched = httpx2.get(proxy.base_url + "/chatstate/conversations",
                              params={"q": "sealed"}, timeout=30)
        assert searched.status_code == 400, searched.text
        assert "encrypted" in searched.text and "search" in searched.text
        assert "CHATSTATE_ENCRYPTED_SEARCH=keyed" in searched.text
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or b"sealed words 41c9" not in path.read_bytes(), path
    raw = open_raw(url)
    try:
        [summary] = [
            s for s in raw.list_conversations() if s.id != "chatstate.encryption"]
        stored = raw.load(summary.id)
        assert stored.messages and stored.messages[0].content[0]["type"] == "chatstate.sealed"
    finally:
        raw.close()


def test_serve_searches_an_encrypted_store_with_the_keyed_index(tmp_path: Path) -> None:
    url = local_url("sqlite", tmp_path)
    env = serve_env(tmp_path, CHATSTATE_ENCRYPTION_KEY=KEY, CHATSTATE_ENCRYPTED_SEARCH="keyed")
    with FakeModel(reply_words=3) as fake, ServeProcess(url, fake.base_url, env) as proxy:
        for words in ("sealed words 41c9", "other talk"):
            r = httpx2.post(proxy.base_url + "/chat/completions", timeout=30, json={
                "model": "m", "messages": [{"role": "user", "content": words}]})
            assert r.status_code == 200, r.text
        listed = httpx2.get(proxy.base_url + "/chatstate/conversations", timeout=30).json()
        assert len(listed["data"]) == 2
        searched = httpx2.get(proxy.base_url + "/chatstate/conversations",
                              params={"q": "41C9"}, timeout=30)
        assert searched.status_code == 200, searched.text
        [hit] = searched.json()["data"]
        assert hit["id"] in {c["id"] for c in listed["data"]}
        none = httpx2.get(proxy.base_url + "/chatstate/conversations",
                          params={"q": "absent"}, timeout=30)
        assert none.status_code == 200 and none.json()["data"] == [], none.text
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or b"41c9" not in path.read_bytes().lower(), path
