"""Half a character from a client or an upstream: JSON can spell a lone UTF-16
surrogate (``"\\ud83d"``: an emoji cut in two), which no store can write as UTF-8.

Stored messages hold text: a surrogate pair is joined, a lone one stored as U+FFFD
(``canonical.well_formed``). Before, the store raised UnicodeEncodeError: the request
failed with a 500 and the upstream's reply was lost. Real serve processes in front of
the fake model, which echoes the user's text back escaped as JSON (as Python servers
write it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from support.serve_helpers import ServeProcess, local_url, serve_env

from chatstate.stores import open_store
from chatstate.testing import FakeModel

HEADER = "x-chatstate-conversation"


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=3) as f:
        yield f


@pytest.mark.parametrize("kind", ["json", "sqlite"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_is_stored_as_a_replacement_and_the_turn_completes(
        tmp_path: Path, fake: FakeModel, kind: str, stream: bool) -> None:
    url = local_url(kind, tmp_path)
    # the escapes as the client's JSON spells them (json.dumps would too)
    text = r'"half \ud83d here, whole \ud83d\ude00 there"'
    body = '{"model": "m", "stream": ' + json.dumps(stream) + \
        ', "messages": [{"role": "user", "content": ' + text + '}]}'

    with ServeProcess(url, fake.base_url, serve_env(tmp_path)) as proxy:
        sent = httpx2.post(proxy.base_url + "/chat/completions", content=body.encode(),
                           headers={"content-type": "application/json"}, timeout=30)
        assert sent.status_code == 200, (sent.text, "\n".join(proxy.lines[-30:]))
        assert "[DONE]" in sent.text if stream else sent.json()["choices"]
        cid = sent.headers[HEADER]
    store = open_store(url)
    try:
        conv = store.load(cid)
    finally:
        store.close()
    user, reply = conv.messages
    assert user.content == "half \ufffd here, whole \U0001f600 there"
    assert reply.status == "complete"
    assert reply.text.startswith("Echo: half \ufffd here, whole \U0001f600 there")
    assert conv.verify() is None
