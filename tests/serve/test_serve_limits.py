"""``chatstate serve`` under load and abuse: one client cannot stall or starve the others.

New conversations never wait on each other, a request whose client left is not sent
upstream, oversized or over-nested requests are refused before they cost anything,
a slow reader does not make the proxy buffer the upstream's reply, idle and
slowloris connections are closed, the readiness probe is cheap and says little to
strangers, and per-namespace limits answer 429 with Retry-After. Real proxy
processes in front of the fake model over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.serve_helpers import ServeProcess, local_url, serve_env

from chatstate.serve._relay import StreamRelay
from chatstate.testing import FakeModel

HEADER = "X-Chatstate-Conversation"


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel(reply_words=6) as f:
        yield f


def start(tmp_path: Path, fake: FakeModel, *args: str, **env: str) -> ServeProcess:
    return ServeProcess(local_url("sqlite", tmp_path), fake.base_url,
                        serve_env(tmp_path, **env), *args)


def ask(proxy: ServeProcess, content: str, timeout: float = 30, **headers: str
        ) -> httpx2.Response:
    return httpx2.post(proxy.base_url + "/chat/completions", timeout=timeout, headers=headers,
                       json={"model": "m", "messages": [{"role": "user", "content": content}]})


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn(*args, **kwargs))
        except BaseException as exc:  # looked at by the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def wait_for(predicate: Any, what: str) -> None:
    """Poll a condition the test is about to rely on (not a timing assertion)."""
    import time

    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def completions_logged(proxy: ServeProcess) -> int:
    return sum(1 for line in proxy.lines if "POST /v1/chat/completions" in line)


# -- item 5: new conversations never wait on each other ------------------------------------
def test_a_new_conversation_does_not_wait_for_another_ones_hanging_upstream(
        tmp_path: Path, fake: FakeModel) -> None:
    with start(tmp_path, fake) as proxy:
        fake.hang_next(60)
        first, _ = in_thread(ask, proxy, "I hang", 90)
        wait_for(lambda: len(fake.request_log) == 1, "the first request reached upstream")
        second = ask(proxy, "I do not", timeout=20)  # header-less, also a first turn
        assert second.status_code == 200, second.text
        assert second.json()["choices"][0]["message"]["content"].startswith("Echo: I do not")
        assert second.headers[HEADER] != ""
        fake.close()  # wakes the hanging handler
        first.join(60)


def test_a_request_whose_client_left_while_queued_is_not_sent_upstream(
        tmp_path: Path, fake: FakeModel) -> None:
    with start(tmp_path, fake) as proxy:
        fake.hang_next(4)
        first, out = in_thread(ask, proxy, "first turn", 60, **{HEADER: "queued-1"})
        wait_for(lambda: len(fake.request_log) == 1, "the first request reached upstream")
        with pytest.raises(httpx2.TimeoutException):  # queued behind the first, then gone
            ask(proxy, "given up", timeout=0.5, **{HEADER: "queued-1"})
        first.join(60)
        assert isinstance(out[0], httpx2.Response) and out[0].status_code == 200
        wait_for(lambda: completions_logged(proxy) == 2, "the proxy ended both requests")
        sent = [e["messages"][-1]["content"] for e in fake.request_log]
        assert sent == ["first turn"]


# -- item 6: caps on message count and nesting depth --------------------------------------
def test_too_many_messages_is_413_and_nothing_goes_upstream(tmp_path: Path,
                                                              fake: FakeModel) -> None:
    with start(tmp_path, fake, "--max-messages", "50") as proxy:
        many = [{"role": "user", "content": f"m{i}"} for i in range(51)]
        r = httpx2.post(proxy.base_url + "/chat/completions", timeout=30,
                        json={"model": "m", "messages": many})
        assert r.status_code == 413
        error = r.json()["error"]
        assert "51 messages" in error["message"] and "--max-messages" in error["message"]
        assert error["type"] == "invalid_request_error"
        assert fake.request_log == []
        assert ask(proxy, "a small one").status_code == 200


def test_deep_nesting_is_400_with_an_openai_shaped_error(tmp_path: Path,
                                                         fake: FakeModel) -> None:
    with start(tmp_path, fake) as proxy:
        for depth in (200, 100_000):  # past the cap; past the JSON parser's recursion
            body = ('{"model":"m","messages":[{"role":"user","content":"x"}],"metadata":'
                    + "[" * depth + "]" * depth + "}")
            r = httpx2.post(proxy.base_url + "/chat/completions", content=body, timeout=30,
                            headers={"content-type": "application/json"})
            assert r.status_code == 400, r.text
            assert "nested" in r.json()["error"]["message"]
        assert fake.request_log == []


# -- item 7: backpressure --------------------------------------------------------------------
def test_the_relay_reads_the_upstream_no_faster_than_the_client_takes_it() -> None:
    pulled = 0

    async def upstream() -> AsyncIterator[str]:
        nonlocal pulled
        for i in range(5000):
            chunk = {"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]}
            for line in (f"data: {json.dumps(chunk)}", ""):
                await asyncio.sleep(0)  # a network read
                pulled += 1
                yield line

    async def slow_client() -> int:
        relay = StreamRelay(upstream(), save_partial=lambda text, model: None,
                            commit=lambda reply: None, fail=lambda detail: None,
                            buffer=4096)
        events = relay.events()
        await events.__anext__()  # the client took one write, then stops reading
        for _ in range(5000):
            await asyncio.sleep(0)
        seen = pulled
        await events.aclose()  # type: ignore[attr-defined]
        return seen

    assert asyncio.run(slow_client()) < 1000  # of 10,000 lines (~300 KB): bounded, not all


def test_a_paced_save_does_not_wait_once_the_upstream_has_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``SMALL_REPLY`` a partial save waits for as much new text as it rewrites, or
    ``PACE_MAX``; a reply whose rest is shorter than that, and whose upstream has ended,
    is committed at once, not after the pause (a 50 MB reply through serve waited 0.5 s
    for nothing). Here the pause would be a minute: the relay must end long before."""
    from chatstate.serve import _relay

    monkeypatch.setattr(_relay, "PACE_MAX", 60.0)
    saved: list[int] = []
    committed: list[str] = []
    piece = "x" * 2000

    def chunk(text: str, finish: str | None = None) -> str:
        delta = {"content": text} if text else {}
        return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta,
                                                   "finish_reason": finish}]})

    async def upstream() -> AsyncIterator[str]:
        for _ in range(50):  # 100,000 characters: past SMALL_REPLY
            yield chunk(piece)
            yield ""
        while not saved or saved[-1] < 100_000:  # the save of all of it has been made
            await asyncio.sleep(0.01)
        for _ in range(10):  # the rest: shorter than what the save rewrote
            yield chunk(piece)
            yield ""
        yield chunk("", "stop")
        yield ""
        yield "data: [DONE]"
        yield ""

    async def client() -> bytes:
        relay = StreamRelay(upstream(), save_partial=lambda text, model: saved.append(
                                len(text)),
                            commit=lambda reply: committed.append(reply["content"]),
                            fail=lambda status, detail: None)
        return b"".join([part async for part in relay.events()])

    assert _relay.SMALL_REPLY < 100_000
    got = asyncio.run(asyncio.wait_for(client(), 30))
    assert committed == ["x" * 120_000]
    assert got.count(b'"content": "x') == 60 and got.endswith(b"data: [DONE]\n\n")


# -- item 8: idle and slowloris connections ---------------------------------------------------
def _connect(proxy: ServeProcess) -> socket.socket:
    host, port = proxy.root.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def test_an_idle_connection_is_closed_after_the_idle_timeout(tmp_path: Path,
                                                             fake: FakeModel) -> None:
    with start(tmp_path, fake, "--idle-timeout", "1") as proxy, _connect(proxy) as sock:
        assert sock.recv(1024) == b""  # closed by the proxy, not by the 30 s socket timeout


def test_a_slowloris_connection_is_closed_after_the_header_timeout(tmp_path: Path,
                                                                   fake: FakeModel) -> None:
    import time

    with start(tmp_path, fake, "--header-timeout", "1") as proxy, _connect(proxy) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.settimeout(0.2)
        closed = False
        for i in range(150):  # a header line every 0.2 s, never the blank line
            try:
                sock.sendall(f"X-Slow-{i}: 1\r\n".encode())
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:  # reset by the proxy
                closed = True
                break
            time.sleep(0)
        assert closed


# -- item 9: readiness ------------------------------------------------------------------------
def test_readyz_tells_strangers_only_the_status(tmp_path: Path, fake: FakeModel) -> None:
    with start(tmp_path, fake, "--token", "tok-ready") as proxy:
        plain = httpx2.get(proxy.root + "/readyz", timeout=10)
        assert plain.status_code == 200
        assert plain.json() == {"ready": True}
        assert str(tmp_path) not in plain.text
        full = httpx2.get(proxy.root + "/readyz", timeout=10,
                          headers={"Authorization": "Bearer tok-ready"})
        assert full.json()["ready"] is True
        assert full.json()["store"]["check"]["ok"] is True


def test_readyz_probes_the_store_at_most_once_per_cache_interval(tmp_path: Path,
                                                                  fake: FakeModel) -> None:
    with start(tmp_path, fake, "--token", "tok", "--ready-cache", "30") as proxy:
        auth = {"Authorization": "Bearer tok"}
        for _ in range(10):
            assert httpx2.get(proxy.root + "/readyz", timeout=10).status_code == 200
        metrics = httpx2.get(proxy.root + "/metrics", headers=auth, timeout=10).text
        assert "chatstate_serve_readiness_probes_total 1.0" in metrics


# -- limits -------------------------------------------------------------------------------------
def test_max_concurrent_answers_429_with_retry_after(tmp_path: Path, fake: FakeModel) -> None:
    with start(tmp_path, fake, "--max-concurrent", "1") as proxy:
        fake.hang_next(3)
        first, out = in_thread(ask, proxy, "holds the slot", 60)
        wait_for(lambda: len(fake.request_log) == 1, "the first request reached upstream")
        refused = ask(proxy, "one too many")
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert "--max-concurrent" in refused.json()["error"]["message"]
        assert refused.json()["error"]["type"] == "rate_limit_error"
        first.join(60)
        assert isinstance(out[0], httpx2.Response) and out[0].status_code == 200
        assert [e["messages"][-1]["content"] for e in fake.request_log] == ["holds the slot"]
        assert ask(proxy, "after it").status_code == 200  # the slot is free again


def test_rate_limit_answers_429_with_retry_after(tmp_path: Path, fake: FakeModel) -> None:
    with start(tmp_path, fake, "--rate", "1/min") as proxy:
        assert ask(proxy, "the one allowed").status_code == 200
        refused = ask(proxy, "too soon")
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert "--rate" in refused.json()["error"]["message"]
        assert len(fake.request_log) == 1


# -- metrics ------------------------------------------------------------------------------------
def test_metrics_are_prometheus_text_behind_the_token(tmp_path: Path, fake: FakeModel) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with start(tmp_path, fake, "--token", "tok-m") as proxy:
        auth = {"Authorization": "Bearer tok-m"}
        assert httpx2.get(proxy.root + "/metrics", timeout=10).status_code == 401
        assert ask(proxy, "count me", **auth).status_code == 200
        with httpx2.stream("POST", proxy.base_url + "/chat/completions", headers=auth,
                           timeout=30, json={"model": "m", "stream": True, "messages": [
                               {"role": "user", "content": "stream me"}]}) as resp:
            resp.read()
        r = httpx2.get(proxy.root + "/metrics", headers=auth, timeout=10)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(r.text)
                   for s in family.samples}
        requests = {k: v for k, v in samples.items()
                    if k[0] == "chatstate_serve_requests_total"}
        ok = {dict(labels)["namespace"]: v for (_, labels), v in requests.items()
              if ("route", "/v1/chat/completions") in labels and ("status", "200") in labels}
        assert list(ok.values()) == [2]  # one namespace: the token's (its digest, not it)
        assert "default" not in ok and not any("tok" in n for n in ok)
        tokens = [v for (name, labels), v in samples.items()
                  if name == "chatstate_serve_tokens_total" and ("model", "m") in labels]
        assert tokens and sum(tokens) > 0
        names = {name for name, _ in samples}
        for expected in ("chatstate_serve_upstream_seconds_count",
                         "chatstate_serve_first_chunk_seconds_count",
                         "chatstate_serve_store_write_seconds_count",
                         "chatstate_serve_lease_conflicts_total"):
            assert expected in names, expected


# -- item 6: the index is looked up in the store, not loaded whole at start-up ---------------
def test_start_up_loads_no_conversation_and_a_lookup_only_its_candidates(
        tmp_path: Path, fake: FakeModel) -> None:
    url = local_url("json", tmp_path)
    with ServeProcess(url, fake.base_url, serve_env(tmp_path)) as first:
        r = ask(first, "remember me")
        cid, reply = r.headers[HEADER], r.json()["choices"][0]["message"]["content"]
        other = ask(first, "unrelated").headers[HEADER]
    damaged = tmp_path / "store" / f"{other}.json"  # its hash chain no longer verifies
    damaged.write_bytes(damaged.read_bytes().replace(b"Echo: unrelated", b"Echo: Unrelated"))
    with ServeProcess(url, fake.base_url, serve_env(tmp_path)) as second:
        history = [{"role": "user", "content": "remember me"},
                   {"role": "assistant", "content": reply},
                   {"role": "user", "content": "and now?"}]
        again = httpx2.post(second.base_url + "/chat/completions", timeout=30,
                            json={"model": "m", "messages": history})
        assert again.status_code == 200
        assert again.headers[HEADER] == cid  # found in the store, header-less
    assert other not in second.stderr  # never loaded: neither at start nor by the lookup
