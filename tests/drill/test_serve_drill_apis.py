"""``chatstate drill --serve --api responses|anthropic``: streaming clients of that wire API
(``/v1/responses``, ``/v1/messages``) under a SIGKILL of serve; every piece any client
received is stored, once (0 lost, 0 duplicated), and a reply is only counted whole when
the API's own end event (``response.completed``, ``message_stop``) arrived."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli_helpers import cli_env, run_cli

from chatstate.drill.serve_apis import wire_api
from chatstate.stores import open_store


@pytest.mark.invariant(2)
@pytest.mark.slow
@pytest.mark.parametrize("api", ["responses", "anthropic"])
def test_serve_drill_of_each_api_loses_and_duplicates_nothing(api: str,
                                                              tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    result = run_cli(["drill", "--serve", "--api", api, "--trials", "3", "--clients", "3",
                      "--seed", "5", "--json"], cli_env(tmp_path), store=url, timeout=300)
    assert result.code == 0, result.err
    (doc,) = json.loads(result.out)
    assert doc["ok"] and doc["api"] == api
    assert doc["kills"] == 3 and doc["requests"] == 9
    assert doc["lost"] == doc["duplicated"] == doc["corrupt"] == 0
    assert doc["acked_turns"] + doc["partials"] > 0  # the clients received something
    store = open_store(url)
    try:
        assert store.list_conversations() == []
    finally:
        store.close()


def test_each_api_reads_its_own_stream_and_end_event() -> None:
    responses, anthropic = wire_api("responses"), wire_api("anthropic")
    delta = 'data: {"type": "response.output_text.delta", "delta": "Hi", "output_index": 0}'
    assert responses.read(delta) == ("Hi", False)
    assert responses.read('data: {"type": "response.completed", "response": {}}') == ("",
                                                                                      True)
    assert responses.read("event: response.completed") == ("", False)
    text = 'data: {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}}'
    assert anthropic.read(text) == ("x", False)
    assert anthropic.read('data: {"type": "message_delta", "delta": {}}') == ("", False)
    assert anthropic.read('data: {"type": "message_stop"}') == ("", True)
    assert anthropic.body([], "q") == {"model": "m", "stream": True, "max_tokens": 1024,
                                       "messages": [{"role": "user", "content": "q"}]}
    with pytest.raises(ValueError, match="use one of chat, responses, anthropic"):
        wire_api("gemini")
