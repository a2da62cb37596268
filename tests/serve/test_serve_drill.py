"""``chatstate drill --serve``: SIGKILL the proxy under concurrent streams; and it can fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli_helpers import cli_env, run_cli

from chatstate.core.transcript import Conversation, Message
from chatstate.drill.serve_drill import ServeDrillResult, _check, _Client
from chatstate.stores import open_store
from conftest import LOCAL_KINDS


@pytest.mark.invariant(2)
@pytest.mark.slow
@pytest.mark.parametrize("kind", LOCAL_KINDS)
def test_serve_drill_kills_the_proxy_and_loses_nothing(kind: str, tmp_path: Path) -> None:
    url = f"json://{tmp_path}/store" if kind == "json" else f"sqlite://{tmp_path}/s.db"
    result = run_cli(["drill", "--serve", "--trials", "4", "--clients", "4", "--seed", "3",
                      "--json"], cli_env(tmp_path), store=url, timeout=300)
    assert result.code == 0, result.err
    (doc,) = json.loads(result.out)
    assert doc["ok"]
    assert doc["kills"] == 4
    assert doc["requests"] == 16
    assert doc["lost"] == doc["duplicated"] == doc["corrupt"] == 0
    assert doc["acked_turns"] + doc["partials"] > 0  # kills landed mid-stream or after
    store = open_store(url)
    try:
        assert store.list_conversations() == []  # the drill's conversations are removed
    finally:
        store.close()


def test_the_check_reports_text_that_was_relayed_but_not_stored(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    user = Message.seal(None, role="user", content="q", turn_id="t1")
    store.create(Conversation(id="c1"))
    store.append("c1", [user])
    store.close()
    client = _Client("c1", received="Echo: q and more")  # relayed, never stored
    result = ServeDrillResult(store=url)
    _check(url, [client], {"c1": "q"}, result)
    assert result.lost == 1
    assert not result.ok
    assert "relayed but are not stored" in result.problems[0]


def test_a_request_the_proxy_refuses_is_reported(tmp_path: Path) -> None:
    """After a kill the next proxy must answer every client: a conversation still held
    (here by the test, as a killed proxy's lease would be if it were not taken over) is
    a 409, and the drill says so instead of counting the turn as merely cut."""
    from support.serve_helpers import ServeProcess, serve_env

    from chatstate.drill.serve_drill import _turn
    from chatstate.testing import FakeModel

    url = f"sqlite://{tmp_path}/s.db"
    store = open_store(url)
    try:
        lease = store.acquire_lease("held", wait=0)
        with FakeModel() as fake, ServeProcess(url, fake.base_url, serve_env(tmp_path)) as p:
            client = _Client("held")
            _turn(p.base_url, client, "hello")
            assert client.refused is not None
            assert "HTTP 409" in client.refused
            assert "conversation_in_use" in client.refused
            assert not client.received
            store.release_lease(lease)
            _turn(p.base_url, client, "hello")
            assert client.refused is None
            assert client.done
            assert client.received
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("api", ["responses", "anthropic_messages"])
def test_serve_drill_speaks_each_wire_api(api: str, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    result = run_cli(["drill", "--serve", "--api", api, "--trials", "3", "--clients", "3",
                      "--seed", "5", "--json"], cli_env(tmp_path), store=url, timeout=300)
    assert result.code == 0, result.err
    (doc,) = json.loads(result.out)
    assert doc["ok"] and doc["kills"] == 3 and doc["requests"] == 9
    assert doc["lost"] == doc["duplicated"] == doc["corrupt"] == 0
    assert doc["acked_turns"] + doc["partials"] > 0
