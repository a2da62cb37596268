"""``chatstate serve`` holds each conversation's writer lease for the length of a turn.

Like ``Chat``: a second writer (another proxy on the same store, as a second host
behind a load balancer would be; a script; a REPL) cannot cut a live stream. It
waits (``--lease-wait``) or is told who holds the conversation, and nothing of its
request is written. Real proxy processes, the fake model over real HTTP, and the
store opened by the test as the other writer.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.serve_helpers import ServeProcess, local_url, serve_env
from support.stores import fresh_load as load

from chatstate import Chat, make_adapter
from chatstate.errors import ConversationInUse
from chatstate.stores import open_store
from chatstate.testing import FakeModel
from conftest import LOCAL_KINDS

USER = [{"role": "user", "content": "hello lease"}]
HEADER = "X-Chatstate-Conversation"


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as f:
        yield f


@pytest.fixture(params=LOCAL_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return local_url(request.param, tmp_path)


def start(store_url: str, fake: FakeModel, tmp_path: Path, *args: str) -> ServeProcess:
    return ServeProcess(store_url, fake.base_url, serve_env(tmp_path), *args)


def post(proxy: ServeProcess, cid: str, **body: Any) -> httpx2.Response:
    return httpx2.post(proxy.base_url + "/chat/completions", headers={HEADER: cid},
                       json={"model": "m", "messages": USER, **body}, timeout=60)


class Stream:
    """A streamed request read in a thread: ``first`` is set at the first content chunk."""

    def __init__(self, proxy: ServeProcess, cid: str) -> None:
        self.first = threading.Event()
        self.text = ""
        self.status = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(proxy, cid), daemon=True)
        self._thread.start()

    def _read(self, proxy: ServeProcess, cid: str) -> None:
        try:
            with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=60,
                               headers={HEADER: cid},
                               json={"model": "m", "stream": True, "messages": USER}) as resp:
                self.status = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        delta = json.loads(line[6:])["choices"][0]["delta"]
                        self.text += delta.get("content") or ""
                        self.first.set()
        except BaseException as exc:  # asserted by the test
            self.error = exc
        finally:
            self.first.set()

    def join(self) -> None:
        self._thread.join(60)
        assert not self._thread.is_alive(), self.error
        assert self.error is None, self.error


@pytest.mark.invariant(5)
def test_a_live_stream_keeps_other_writers_out_until_it_ends(
        store_url: str, fake: FakeModel, tmp_path: Path) -> None:
    """While serve streams a turn, a Chat, the lease API and a second proxy on the same
    store are each refused, naming the proxy's host and pid; the stream ends whole, and
    then the others get in."""
    # a stream of about seven seconds: time for the other writers to try, on a loaded machine
    fake.configure(chunk_delay=0.15, reply_words=50)
    with start(store_url, fake, tmp_path / "a") as a, \
            start(store_url, fake, tmp_path / "b") as b:
        live = Stream(a, "shared")
        assert live.first.wait(30), live.error
        assert live.status == 200, live.error
        store = open_store(store_url)
        try:
            with pytest.raises(ConversationInUse) as held:
                store.acquire_lease("shared", wait=0)
            assert held.value.pid == a.proc.pid
            assert held.value.host == socket.gethostname()
            adapter = make_adapter(base_url=fake.base_url, api_key="k", model="m")
            chat = Chat(store, conversation_id="shared", adapter=adapter)
            with pytest.raises(ConversationInUse):
                chat.send("me too")
            second = post(b, "shared")  # another host behind the same load balancer
            assert second.status_code == 409, second.text
            error = second.json()["error"]
            assert error["type"] == "conversation_in_use"
            assert f"pid {a.proc.pid}" in error["message"]
            assert "--lease-wait" in error["message"]
            live.join()
            conv = load(store_url, "shared")
            # the stream was never cut: one turn, its reply complete and what was shown
            assert [(m.role, m.status) for m in conv.messages] == [("user", "complete"),
                                                                   ("assistant", "complete")]
            assert conv.messages[-1].text == live.text
            assert conv.partial is None
            # the lease went with the turn: the second proxy, then the Chat, get in
            more = [*USER, {"role": "assistant", "content": live.text},
                    {"role": "user", "content": "and b"}]
            assert post(b, "shared", messages=more).status_code == 200
            Chat(store, conversation_id="shared", adapter=adapter).send("my turn now")
        finally:
            store.close()
    conv = load(store_url, "shared")
    assert [m.text for m in conv.messages if m.role == "user"] == [
        "hello lease", "and b", "my turn now"]
    assert conv.verify() is None


def test_a_refused_request_writes_nothing_and_calls_no_model(
        store_url: str, fake: FakeModel, tmp_path: Path) -> None:
    with start(store_url, fake, tmp_path) as proxy:
        assert post(proxy, "held").status_code == 200
        before = load(store_url, "held")
        calls = len(fake.request_log)
        store = open_store(store_url)
        try:
            lease = store.acquire_lease("held", wait=0)
            body = {"messages": [*USER, {"role": "assistant",
                                         "content": before.messages[-1].text},
                                 {"role": "user", "content": "again"}]}
            for stream in (False, True):
                refused = post(proxy, "held", stream=stream, **body)
                assert refused.status_code == 409, refused.text
                assert f"pid {os.getpid()}" in refused.json()["error"]["message"]
            assert len(fake.request_log) == calls  # never sent upstream
            after = load(store_url, "held")
            assert [m.hash for m in after.messages] == [m.hash for m in before.messages]
            assert after.metadata == before.metadata
            store.release_lease(lease)
            assert post(proxy, "held", **body).status_code == 200
        finally:
            store.close()
        assert [m.text for m in load(store_url, "held").messages if m.role == "user"] == [
            "hello lease", "again"]


def test_lease_wait_waits_for_the_other_writer(store_url: str, fake: FakeModel,
                                               tmp_path: Path) -> None:
    with start(store_url, fake, tmp_path, "--lease-wait", "30") as proxy:
        store = open_store(store_url)
        try:
            lease = store.acquire_lease("waited", wait=0)
            answered: list[tuple[float, int]] = []

            def ask() -> None:
                status = post(proxy, "waited").status_code
                answered.append((time.monotonic(), status))

            thread = threading.Thread(target=ask)
            thread.start()
            time.sleep(1.0)
            assert answered == []
            assert fake.request_log == []  # waiting, nothing sent
            released = time.monotonic()
            store.release_lease(lease)
            thread.join(60)
        finally:
            store.close()
    assert len(answered) == 1
    assert answered[0][1] == 200
    assert answered[0][0] >= released
    assert [m.role for m in load(store_url, "waited").messages] == ["user", "assistant"]


@pytest.mark.parametrize("ending", ["upstream error", "client gone", "upstream unreachable"])
def test_every_way_a_turn_ends_gives_the_lease_up(store_url: str, fake: FakeModel,
                                                  tmp_path: Path, ending: str) -> None:
    if ending == "upstream unreachable":
        dead = socket.socket()
        dead.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        upstream = f"http://127.0.0.1:{dead.getsockname()[1]}/v1"
        proxy = ServeProcess(store_url, upstream, serve_env(tmp_path))
    else:
        proxy = start(store_url, fake, tmp_path)
    with proxy:
        if ending == "upstream error":
            fake.fail_next(500, times=2)
            assert post(proxy, "ends").status_code == 500
            with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=60,
                               headers={HEADER: "ends"},
                               json={"model": "m", "stream": True, "messages": USER}) as r:
                assert r.status_code == 500
        elif ending == "client gone":
            fake.configure(chunk_delay=0.1, reply_words=60)
            with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=60,
                               headers={HEADER: "ends"},
                               json={"model": "m", "stream": True, "messages": USER}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {") and \
                            json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        break  # leaving the block drops the connection mid-stream
        else:
            assert post(proxy, "ends").status_code == 502
        store = open_store(store_url)
        try:
            # the proxy ends the turn as the response ends; a dead holder would take 15 s
            lease = store.acquire_lease("ends", wait=10)
            store.release_lease(lease)
            conv = store.load("ends")
        finally:
            store.close()
        assert conv.messages[0].text == "hello lease"
        if ending == "client gone":  # the cut reply was saved before the lease went
            assert conv.partial is not None
            assert conv.partial.text
        if ending == "upstream unreachable":
            dead.close()
