"""``chatstate drill --serve --identity``: the kill -9 drill with clients that name their
conversation in the base URL, or not at all (found by history within a token's
namespace); and the drill's check fails when the store lost what a client received."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli_helpers import cli_env, run_cli

from chatstate.core.transcript import Conversation, Message
from chatstate.drill.serve_drill import ServeDrillResult, _check, _Client, _with_conversation
from chatstate.stores import open_store

RUN = "abc123"


@pytest.mark.invariant(2)
@pytest.mark.slow
@pytest.mark.parametrize("identity", ["header", "url", "none"])
def test_serve_drill_in_each_identity_mode_loses_nothing(identity: str,
                                                         tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    result = run_cli(["drill", "--serve", "--trials", "3", "--clients", "3", "--seed", "5",
                      "--identity", identity, "--json"], cli_env(tmp_path), store=url,
                     timeout=300)
    assert result.code == 0, result.err + result.out
    (doc,) = json.loads(result.out)
    assert doc["ok"], doc["problems"]
    assert doc["identity"] == identity
    assert doc["kills"] == 3
    assert doc["requests"] == 9
    assert doc["lost"] == doc["duplicated"] == doc["corrupt"] == 0
    assert doc["acked_turns"] + doc["partials"] > 0  # kills landed mid-stream or after
    store = open_store(url)
    try:
        assert store.list_conversations() == []  # the drill's conversations are removed
    finally:
        store.close()


def _stored(url: str, cid: str, title: str, texts: list[str]) -> None:
    store = open_store(url)
    try:
        store.create(Conversation(id=cid, title=title))
        prev = None
        for n, text in enumerate(texts):
            prev = Message.seal(prev, role="user", content=text, turn_id=f"t{n}")
            store.append(cid, [prev])
    finally:
        store.close()


def test_a_lost_chunk_fails_the_drill_for_a_header_less_client(tmp_path: Path) -> None:
    """Header-less, the check loads the id the proxy handed back: text relayed to the
    client but missing from that conversation is lost."""
    url = f"sqlite://{tmp_path}/s.db"
    _stored(url, "handed-1", f"q drill-serve-{RUN}-0", ["q"])
    client = _Client(f"drill-serve-{RUN}-0", identity="none", conversation="handed-1",
                     received="Echo: q and more")  # relayed, never stored
    result = ServeDrillResult(store=url, identity="none")
    _check(url, [client], {client.cid: "q"}, result, RUN)
    assert result.lost == 1
    assert not result.ok
    assert "relayed but are not stored" in result.problems[0]


def test_a_lost_chunk_fails_the_drill_for_a_base_url_client(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    _stored(url, "c1", "q", ["q"])
    client = _Client("c1", identity="url", received="Echo: q")
    result = ServeDrillResult(store=url, identity="url")
    _check(url, [client], {"c1": "q"}, result)
    assert result.lost == 1
    assert not result.ok


def test_a_header_less_retry_stored_in_a_second_conversation_is_a_duplicate(
        tmp_path: Path) -> None:
    """The retry of a cut first turn found no conversation by its history and started
    another: each holds the user's message once, the run holds it twice."""
    url = f"sqlite://{tmp_path}/s.db"
    text = f"turn 0 of drill-serve-{RUN}-0"
    _stored(url, "first", text, [text])
    _stored(url, "second", text, [text])
    _stored(url, "the-users-own", "unrelated", [text])  # not the run's: not counted
    client = _Client(f"drill-serve-{RUN}-0", identity="none", conversation="second")
    result = ServeDrillResult(store=url, identity="none")
    _check(url, [client], {client.cid: text}, result, RUN)
    assert result.duplicated == 1
    assert "stored 2 times across the run's conversations" in result.problems[0]


def test_a_base_url_names_the_conversation() -> None:
    assert (_with_conversation("http://127.0.0.1:8080/v1", "c-1")
            == "http://127.0.0.1:8080/c/c-1/v1")
    assert (_with_conversation("http://[::1]:80/v1", "x") == "http://[::1]:80/c/x/v1")
