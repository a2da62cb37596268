"""A new conversation through ``chatstate serve`` costs one store write before the request
goes upstream: its writer lease, its header and the request's messages together
(``create_leased``), not a lease, a create and an append one after another.

Counted from the proxy's own ``/metrics`` (every store write it makes, by operation),
over real HTTP, against real json and sqlite stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from support.serve_helpers import ServeProcess, local_url, serve_env

from chatstate.stores import open_store
from chatstate.testing import FakeModel

HEADER = "X-Chatstate-Conversation"


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as f:
        yield f


def writes(proxy: ServeProcess) -> dict[str, float]:
    """Store writes the proxy made so far, by operation."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx2.get(proxy.root + "/metrics", timeout=10)
    assert r.status_code == 200
    return {s.labels["op"]: s.value for family in text_string_to_metric_families(r.text)
            for s in family.samples if s.name == "chatstate_serve_store_write_seconds_count"}


def stream(proxy: ServeProcess, messages: list[dict[str, str]], **headers: str
           ) -> tuple[str, str]:
    with httpx2.stream("POST", proxy.base_url + "/chat/completions", headers=headers,
                       timeout=30, json={"model": "m", "stream": True,
                                         "messages": messages}) as resp:
        assert resp.status_code == 200
        resp.read()
        return resp.headers[HEADER], resp.text


@pytest.mark.parametrize("kind", ["sqlite", "json"])
@pytest.mark.parametrize("named", [False, True], ids=["header-less", "named"])
def test_a_new_conversation_is_one_write_before_upstream(tmp_path: Path, fake: FakeModel,
                                                         kind: str, named: bool) -> None:
    url = local_url(kind, tmp_path)
    proxy = ServeProcess(url, fake.base_url, serve_env(tmp_path))
    try:
        before = writes(proxy)
        headers = {HEADER: "fresh-1"} if named else {}
        cid, _ = stream(proxy, [{"role": "user", "content": "hello there"}], **headers)
        after = writes(proxy)
        made = {op: after[op] - before.get(op, 0) for op in after
                if after[op] != before.get(op, 0)}
        # the first write: the lease, the header and the user message, all at once
        assert made.get("create_leased") == 1
        assert "acquire_lease" not in made and "create" not in made
        # then the reply (partial saves, the complete reply) and the lease given back
        assert made.get("append") == 1 and made.get("release_lease") == 1
        # a second turn on it takes the lease of a stored conversation, as before
        stream(proxy, [{"role": "user", "content": "hello there"},
                       {"role": "assistant", "content": "x"},
                       {"role": "user", "content": "again"}], **{HEADER: cid})
        assert writes(proxy).get("acquire_lease") == 1
    finally:
        proxy.stop()
    store = open_store(url)
    try:
        conv = store.load(cid)
        assert [m.role for m in conv.messages][:2] == ["user", "assistant"]
        assert conv.messages[0].text == "hello there"
        assert conv.messages[1].status == "complete"
        # nobody holds it any more: another writer takes its lease at once
        store.release_lease(store.acquire_lease(cid))
    finally:
        store.close()
