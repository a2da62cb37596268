"""``serve`` stores a Responses reply cut by ``max_output_tokens`` as cut even when the
upstream calls it ``completed``, as llama.cpp does (the fake's ``responses_cut_status``).
The client gets what the upstream sent; the store says ``finish_reason: length``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from support.serve_helpers import ServeProcess, serve_env

from chatstate.stores import open_store
from chatstate.testing import FakeModel

TOKEN = "tok-cut-status-0123456789abcdef0123456789"


def last_replies(url: str) -> dict[str, Any]:
    store = open_store(url)
    try:
        convs = [store.load(s.id) for s in store.list_conversations()]
    finally:
        store.close()
    return {c.messages[0].text: c.messages[-1] for c in convs}


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_serve_stores_a_completed_responses_reply_at_the_limit_as_cut(
        tmp_path: Path, streamed: bool) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    with FakeModel(reply_words=6) as fake, \
            ServeProcess(url, fake.base_url, serve_env(tmp_path), "--token", TOKEN) as proxy:
        fake.configure(responses_cut_status="completed")
        client = openai.OpenAI(base_url=proxy.base_url, api_key=TOKEN, max_retries=0)
        for question, limit in (("cut me short", 3), ("let me finish", 100)):
            if streamed:
                with client.responses.stream(model="fake-model", input=question,
                                             max_output_tokens=limit) as stream:
                    got = stream.get_final_response()
            else:
                got = client.responses.create(model="fake-model", input=question,
                                              max_output_tokens=limit)
            assert got.status == "completed"  # what the upstream said reaches the client
        assert all(e["body"].get("max_output_tokens") in (3, 100) for e in fake.request_log)
    stored = last_replies(url)
    cut, whole = stored["cut me short"], stored["let me finish"]
    assert len(cut.text.split()) == 3 and cut.finish_reason == "length"
    assert whole.text.startswith("Echo: let me finish") and whole.finish_reason in (None, "stop")
