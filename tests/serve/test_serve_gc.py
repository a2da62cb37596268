"""The cyclic collector in a ``chatstate serve`` process (``chatstate.serve._gc``): start-up
frozen and young passes rare, the passes and their pauses on ``/metrics``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
from support.serve_helpers import ServeProcess, local_url, serve_env

from chatstate.testing import FakeModel


def collector(proxy: ServeProcess) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx2.get(proxy.root + "/metrics", timeout=10)
    assert r.status_code == 200
    return {(s.name, s.labels["generation"]): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples
            if s.name.startswith("chatstate_serve_gc_")}


def test_a_burst_of_streams_makes_few_collector_passes(tmp_path: Path) -> None:
    """60 new conversations, 12 at a time: CPython's default thresholds make dozens of
    young passes over what the streams keep alive (a 200-stream burst: ~160 of them and
    two full passes, ~250 ms of pauses); serve's setting a few at most."""
    with FakeModel(reply_words=30) as fake:
        proxy = ServeProcess(local_url("sqlite", tmp_path), fake.base_url,
                             serve_env(tmp_path))
        try:
            before = collector(proxy)
            assert {g for _, g in before} == {"0", "1", "2"}, before

            def one(i: int) -> int:
                with httpx2.stream("POST", proxy.base_url + "/chat/completions", timeout=30,
                                   json={"model": "m", "stream": True, "messages": [
                                       {"role": "user", "content": f"question {i}"}]}) as r:
                    r.read()
                    return r.status_code

            with ThreadPoolExecutor(12) as pool:
                assert set(pool.map(one, range(60))) == {200}
            after = collector(proxy)
        finally:
            proxy.stop()
    young = after[("chatstate_serve_gc_passes_total", "0")] - \
        before[("chatstate_serve_gc_passes_total", "0")]
    full = after[("chatstate_serve_gc_passes_total", "2")] - \
        before[("chatstate_serve_gc_passes_total", "2")]
    assert young <= 5 and full == 0, after
    assert all(v >= 0 for v in after.values()), after
