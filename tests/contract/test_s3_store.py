"""S3-specific behaviour of the s3 store against a real moto server on loopback.

The shared store contract suite covers the protocol; these tests cover what
only an object store has: racing conditional writes, lost answers, injected
5xx, an endpoint that goes away, the object layout, snapshots and request cost.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.s3server import FaultProxy, make_bucket, moto_endpoint, s3_url, start_moto

from chatstate.core.transcript import Conversation, Message
from chatstate.errors import (
    ChatstateError,
    ConflictError,
    CorruptTranscriptError,
    SchemaVersionError,
    StoreUnavailable,
)
from chatstate.stores import open_store
from chatstate.stores.s3.store import S3Store

__all__ = ["moto_endpoint"]  # the fixture, re-exported so pytest finds it here


def seal(prev: Message | None, n: int = 1, text: str = "m", role: str = "user") -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        prev = Message.seal(prev, role=role, content=f"{text} {i}",  # type: ignore[arg-type]
                            turn_id=f"t-{text}-{i}")
        out.append(prev)
    return out


def fresh(url: str, cid: str = "c1", title: str = "t") -> S3Store:
    store = open_store(url)
    store.create(Conversation(id=cid, title=title))
    return store  # type: ignore[no-any-return]


@pytest.fixture
def bucket(moto_endpoint: str) -> str:
    return make_bucket(moto_endpoint)


@pytest.fixture
def url(moto_endpoint: str, bucket: str) -> str:
    return s3_url(moto_endpoint, bucket)


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    p = FaultProxy(moto_endpoint).start()
    yield p
    p.stop()


# -- URL and location ----------------------------------------------------------------
@pytest.mark.invariant(9)
@pytest.mark.parametrize("bad, leak", [
    ("s3://AKIAXXXX:s3cr3tpass@bucket/p", "s3cr3tpass"),
    ("s3://bucket/p?secret_access_key=s3cr3tpass", "s3cr3tpass"),
    ("s3://bucket/p?endpoint_url=http://u:s3cr3tpass@host:9000&allow_http=true", "s3cr3tpass"),
])
def test_url_with_credentials_is_refused_without_echoing_them(bad: str, leak: str) -> None:
    with pytest.raises(ChatstateError) as info:
        S3Store.from_url(bad)
    assert leak not in str(info.value)
    assert "environment" in str(info.value) or "credentials" in str(info.value)


def test_plain_http_endpoint_needs_allow_http() -> None:
    with pytest.raises(ChatstateError, match="allow_http=true"):
        S3Store.from_url("s3://bucket/p?endpoint_url=http://127.0.0.1:9")


def test_from_url_does_no_io_and_location_is_remote() -> None:
    store = S3Store.from_url("s3://my-bucket/a/b?endpoint_url=http://127.0.0.1:9&allow_http=true"
                             "&region=eu-west-1")
    loc = store.location()
    assert loc.path is None
    assert loc.remote == "http://127.0.0.1:9 bucket my-bucket"
    assert store.target.prefix == "a/b"
    assert store.target.region == "eu-west-1"
    assert S3Store.partial_flush_interval == 0.25


def test_guard_says_durable_and_check_probes(url: str) -> None:
    store = open_store(url)
    assert store.guard_report.verdict == "durable"
    report = store.check()
    assert report.ok, report.error
    assert [s.split(" ")[0] for s in report.steps] == ["wrote", "read", "deleted", "refused:"]
    assert store.io.keys("_probe") == []
    assert len(store.opens()) == 1


# -- compare-and-append --------------------------------------------------------------
def race(stores: list[S3Store], candidates: list[Message]) -> dict[int, Any]:
    """Every store appends its candidate at once; returns 'won' or the error per store."""
    barrier = threading.Barrier(len(stores))
    outcome: dict[int, Any] = {}

    def write(i: int) -> None:
        barrier.wait()
        try:
            stores[i].append("c1", [candidates[i]])
            outcome[i] = "won"
        except ConflictError as exc:
            outcome[i] = exc

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


@pytest.mark.invariant(5)
def test_racing_writers_exactly_one_wins_each_round(url: str) -> None:
    stores = [fresh(url)] + [open_store(url) for _ in range(7)]
    prev: Message | None = None
    for _round in range(3):
        candidates = [seal(prev, text=f"w{i}")[0] for i in range(len(stores))]
        outcome = race(stores, candidates)
        winners = [i for i, o in outcome.items() if o == "won"]
        assert len(winners) == 1, outcome
        assert all(isinstance(o, ConflictError) for i, o in outcome.items() if i != winners[0])
        prev = candidates[winners[0]]
    assert prev is not None
    conv = open_store(url).load("c1")
    assert [m.seq for m in conv.messages] == [0, 1, 2]
    assert conv.verify() is None
    assert conv.messages[-1].hash == prev.hash


@pytest.mark.invariant(5)
def test_stale_writer_gets_conflict_and_nothing_is_written(url: str) -> None:
    a, b = fresh(url), open_store(url)
    first = seal(None)
    a.append("c1", first)
    b.append("c1", seal(first[0], text="b"))
    with pytest.raises(ConflictError):
        a.append("c1", seal(first[0], text="a"))
    assert [m.content for m in a.load("c1").messages] == ["m 0", "b 0"]


@pytest.mark.invariant(5)
def test_lost_answer_then_retry_does_not_duplicate(url: str, proxy: FaultProxy,
                                                   bucket: str) -> None:
    store = fresh(s3_url(proxy.endpoint, bucket))
    msgs = seal(None, 3)
    # the PUT lands upstream but the answer is a 500: obstore retries, meets 412, and the
    # store recognises its own segment
    proxy.fail(500, 1, method="PUT", path_contains="/m/", after_forward=True)
    store.append("c1", msgs[:1])
    # the answer is lost on every attempt: outcome unknown, the caller retries
    proxy.fail(500, 50, method="PUT", path_contains="/m/", after_forward=True)
    with pytest.raises(StoreUnavailable):
        store.append("c1", msgs[1:])
    proxy.reset()
    store.append("c1", msgs[1:])
    store.append("c1", msgs)  # a retry of everything is a no-op as well
    conv = open_store(url).load("c1")
    assert [m.hash for m in conv.messages] == [m.hash for m in msgs]
    keys = [k for k, _ in store.io.keys("conversations/c1/m")]
    assert keys == ["conversations/c1/m/0000000000.json", "conversations/c1/m/0000000001.json"]


@pytest.mark.invariant(4)
def test_multi_message_append_is_one_object(url: str) -> None:
    store = fresh(url)
    store.append("c1", seal(None, 4))
    assert len(store.io.keys("conversations/c1/m")) == 1
    assert len(open_store(url).load("c1").messages) == 4


# -- snapshots and layout ------------------------------------------------------------
def full_read(store: S3Store, cid: str) -> list[Message]:
    """Every segment, ignoring snapshots: what the snapshots must agree with."""
    from chatstate.stores.s3 import _doc as doc

    out: list[Message] = []
    for key, _ in store.io.keys(f"conversations/{cid}/m"):
        blob = store.io.get(key)
        assert blob is not None
        out += doc.decode_messages(blob.data, key, len(out))
    return out


def test_snapshot_load_equals_full_load_and_is_bounded(url: str, proxy: FaultProxy,
                                                       bucket: str) -> None:
    store = fresh(url)
    prev: Message | None = None
    sizes = [1] * 61 + [4] + [1] * 61 + [3, 2] + [1] * 60  # batches straddle 64 and 128
    for size in sizes:
        batch = seal(prev, size, text=f"s{len(sizes)}")
        store.append("c1", batch)
        prev = batch[-1]
    snaps = [k.rsplit("/", 1)[1] for k, _ in store.io.keys("conversations/c1/snap")]
    assert snaps == ["0000000064.json", "0000000128.json"]  # segment ends after 63 and 127
    cold = open_store(s3_url(proxy.endpoint, bucket))
    proxy.reset()
    conv = cold.load("c1")
    assert [m.hash for m in conv.messages] == [m.hash for m in full_read(store, "c1")]
    assert len(conv.messages) == sum(sizes)
    assert conv.verify() is None
    # the 61 segments after the newest snapshot, header, index, partial, snapshot, 2 listings
    assert proxy.count() == 61 + 6


@pytest.mark.invariant(6)
def test_tampered_message_is_named_and_left_alone(url: str) -> None:
    store = fresh(url)
    msgs = seal(None, 5)
    for m in msgs:
        store.append("c1", [m])
    key = "conversations/c1/m/0000000003.json"
    blob = store.io.get(key)
    assert blob is not None
    tampered = blob.data.replace(b"m 3", b"m 9")
    store.io.put(key, tampered)
    with pytest.raises(CorruptTranscriptError) as info:
        open_store(url).load("c1")
    assert info.value.position == 3
    assert key in info.value.where
    assert key in str(info.value)
    store.io.put(key, b'{"schema": 99, "messages": []}')
    with pytest.raises(SchemaVersionError):
        open_store(url).load("c1")
    store.io.put(key, b"{not json")
    with pytest.raises(CorruptTranscriptError, match="0000000003"):
        open_store(url).load("c1")
    again = store.io.get(key)
    assert again is not None
    assert again.data == b"{not json"


def test_listing_is_newest_first_and_survives_a_lost_index(url: str) -> None:
    store = open_store(url)
    for cid in ("a", "b", "c"):
        store.create(Conversation(id=cid, title=cid.upper()))
        time.sleep(0.002)
    store.append("a", seal(None, 2))
    listed = store.list_conversations()
    assert [s.id for s in listed] == ["a", "c", "b"]
    assert listed[0].message_count == 2
    assert listed[0].title == "A"
    assert [s.id for s in store.list_conversations(limit=1)] == ["a"]
    store.io.delete(["index/a.json"])  # e.g. a writer killed between append and index
    assert open_store(url).list_conversations()[0].id == "a"
    assert store.io.get("index/a.json") is not None  # repaired by the listing's load


# -- partial replies -----------------------------------------------------------------
def test_partial_replaced_by_if_match_and_cleared_by_append(url: str) -> None:
    store = fresh(url)
    user = seal(None)[0]
    store.append("c1", [user])
    reply = Message.seal(user, role="assistant", content="He", turn_id=user.turn_id,
                         status="partial")
    store.save_partial("c1", reply)
    store.save_partial("c1", reply.model_copy(update={"content": "Hello"}))
    assert open_store(url).load("c1").partial.content == "Hello"
    other = open_store(url)
    other.save_partial("c1", reply.model_copy(update={"content": "Other"}))
    with pytest.raises(ConflictError, match="another writer"):
        store.save_partial("c1", reply.model_copy(update={"content": "Hello there"}))
    final = Message.seal(user, role="assistant", content="Hello there", turn_id=user.turn_id)
    other.append("c1", [final])
    conv = open_store(url).load("c1")
    assert conv.partial is None
    assert conv.messages[-1].content == "Hello there"
    assert store.io.get("conversations/c1/partial.json") is None


def test_request_cost_per_turn(proxy: FaultProxy, bucket: str) -> None:
    store = fresh(s3_url(proxy.endpoint, bucket))
    user = seal(None)[0]
    proxy.reset()
    store.append("c1", [user])
    assert proxy.count() == 3  # GET index, PUT segment, PUT index
    proxy.reset()
    text = ""
    for chunk in ("Hel", "lo", " there"):  # a reply streamed in 3 flushes
        text += chunk
        store.save_partial("c1", Message.seal(user, role="assistant", content=text,
                                              turn_id=user.turn_id, status="partial"))
    assert proxy.count() == 3 + 1  # the first flush also reads the index
    proxy.reset()
    store.append("c1", [Message.seal(user, role="assistant", content=text,
                                     turn_id=user.turn_id)])
    assert proxy.count() == 4  # GET index, PUT segment, PUT index, DELETE partial


def test_request_cost_of_fencing(proxy: FaultProxy, bucket: str) -> None:
    """A fenced write costs one GET of the lease object more, and no more round trips
    where it overlaps the index read."""
    store = fresh(s3_url(proxy.endpoint, bucket))
    user = seal(None)[0]
    fence = store.acquire_lease("c1", term=60).owner
    proxy.reset()
    store.append("c1", [user], fence=fence)
    assert proxy.count() == 3 + 1
    proxy.reset()
    text = ""
    for chunk in ("Hel", "lo", " there"):
        text += chunk
        store.save_partial("c1", Message.seal(user, role="assistant", content=text,
                                              turn_id=user.turn_id, status="partial"),
                           fence=fence)
    assert proxy.count() == 3 + 1 + 3  # each flush reads the lease before its PUT
    proxy.reset()
    store.append("c1", [Message.seal(user, role="assistant", content=text,
                                     turn_id=user.turn_id)], fence=fence)
    assert proxy.count() == 4 + 1


# -- faults --------------------------------------------------------------------------
def test_transient_5xx_are_retried(url: str, proxy: FaultProxy, bucket: str) -> None:
    store = fresh(s3_url(proxy.endpoint, bucket))
    msgs = seal(None, 4)
    proxy.fail(500, 2)
    proxy.fail(503, 2)
    store.append("c1", msgs[:2])
    proxy.fail(503, 3, method="PUT")
    store.append("c1", msgs[2:])
    proxy.fail(500, 2, method="GET")
    conv = store.load("c1")
    assert [m.hash for m in conv.messages] == [m.hash for m in msgs]
    assert sum(1 for _, _, status in proxy.log if status >= 500) == 9
    assert [m.hash for m in open_store(url).load("c1").messages] == [m.hash for m in msgs]


@pytest.mark.invariant(4)
def test_endpoint_gone_mid_run_gives_store_unavailable_and_no_torn_turn(
        url: str, proxy: FaultProxy, bucket: str) -> None:
    store = fresh(s3_url(proxy.endpoint, bucket))
    errors: list[StoreUnavailable] = []
    written: list[Message] = []

    def writer() -> None:
        prev: Message | None = None
        try:
            for i in range(10_000):
                user = Message.seal(prev, role="user", content=f"q{i}", turn_id=f"t{i}")
                store.append("c1", [user])
                written.append(user)
                part = Message.seal(user, role="assistant", content="pa", turn_id=f"t{i}",
                                    status="partial")
                store.save_partial("c1", part)
                prev = Message.seal(user, role="assistant", content=f"a{i}", turn_id=f"t{i}")
                store.append("c1", [prev])
                written.append(prev)
        except StoreUnavailable as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(1.5)
    proxy.stop()  # the endpoint goes away in the middle of whatever request is next
    thread.join(60)
    assert not thread.is_alive()
    assert len(errors) == 1
    text = str(errors[0])
    assert proxy.endpoint in text
    assert f"s3://{bucket}/t/" in text
    assert "retry" in text
    conv = open_store(url).load("c1")  # straight at moto: every message whole, chain intact
    assert conv.verify() is None
    hashes = [m.hash for m in conv.messages]
    assert hashes[:len(written)] == [m.hash for m in written]
    assert len(hashes) - len(written) in (0, 1)  # the one in flight landed whole, or not
    assert conv.partial is None or conv.partial.seq == len(conv.messages)


@pytest.mark.invariant(9)
def test_stopped_server_is_a_clear_error_without_credentials(
        monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> None:
    canary = "canary-Secret-Key-0123456789abcdef"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canary)
    monkeypatch.setenv("AWS_SESSION_TOKEN", canary + "-token")
    server = start_moto()
    try:
        store_url = s3_url(server.endpoint, make_bucket(server.endpoint))
        store = fresh(store_url)
        user = seal(None)[0]
        store.append("c1", [user])
        server.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.append("c1", seal(user, text="after"))
        assert time.monotonic() - started < 30
        report = store.check()
    finally:
        server.stop()
    text = str(info.value)
    assert server.endpoint in text
    assert "s3://" in text
    assert "reachable" in text
    everything = "".join(traceback.format_exception(info.value)) + repr(info.value) + \
        str(report.to_dict())
    assert canary not in everything
    assert not report.ok
    assert report.error
    assert server.endpoint in report.error


@pytest.mark.invariant(9)
def test_credentials_from_a_profile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    url: str) -> None:
    canary = "canary-profile-secret-0123456789"
    creds = tmp_path / "credentials"
    creds.write_text(f"[dev]\naws_access_key_id = prof\naws_secret_access_key = {canary}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "dev")
    assert open_store(url).check().ok
    monkeypatch.setenv("AWS_PROFILE", "nope")
    with pytest.raises(ChatstateError, match="AWS_PROFILE") as info:
        open_store(url)
    assert "nope" in str(info.value)
    assert canary not in str(info.value)


def test_missing_bucket_says_so(moto_endpoint: str) -> None:
    with pytest.raises(StoreUnavailable, match="does not exist"):
        open_store(s3_url(moto_endpoint, "no-such-bucket-here"))


def test_missing_credentials_are_said_plainly() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run([sys.executable, "-m", "chatstate", "--store",
                           "s3://no-such-bucket/p?region=us-east-1", "list"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    assert "no AWS credentials were found" in done.stderr
    assert "Traceback" not in done.stderr
